//! The **advance** phase's work on one running task: its controller-side steps (cordon,
//! drain, waits), one pass each, then the health gates and the task's end. Each task is
//! advanced by a job of its own ([`spawn_advance`]).
//!
//! An advance is a loop over the task's next step ([`advance_running_task`]); each kind of
//! next move is a function of its own: [`finish`] (every step done: the gates decide),
//! [`dry_run_step`], [`run_controller_step`] (whose outcome is turned into a write by the
//! pure [`step_result`]). The writes they hold back are kept in [`Unwritten`].

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use bosun_api::node_task::{
    BlockReason, NodeTask, NodeTaskPhase, NodeTaskStatus, StepError, StepPhase,
};
use bosun_api::operation::{Operation, RunsOn};
use bosun_cluster::status::{StepEnd, StepWrite, TaskStatusWrite, step_manager};
use bosun_planner::state::{Progress, TaskEvent, progress, step_status, task_transition};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde_json::json;
use tracing::Instrument;

use super::{Context, apply_task_status, mirror_top, moved};
use crate::actions::StepOutcome;
use crate::cache::Writes;
use crate::error::{Error, Result};

/// Whether a running task's next move is the controller's: a controller step next or in
/// progress, every step done (the health gates and the task's end), or a step that reboots
/// the node in progress (its deadline is the controller's to keep). Other agent steps, and a
/// failure waiting for a person, are not.
pub(super) fn controller_moves_next(task: &NodeTask) -> bool {
    let status = task.status.clone().unwrap_or_default();
    match progress(&task.spec.steps, &status.steps) {
        Progress::Done
        | Progress::Next {
            runs_on: RunsOn::Controller,
            ..
        }
        | Progress::Running {
            runs_on: RunsOn::Controller,
            ..
        } => true,
        Progress::Running {
            index,
            runs_on: RunsOn::Agent,
        } => task.spec.steps[index].await_new_boot,
        _ => false,
    }
}

/// The step timeout when the Operation sets none (`spec.stepTimeoutSeconds`), in seconds.
pub const DEFAULT_STEP_TIMEOUT_SECONDS: u32 = 1800;

/// A step that reboots the node (`awaitNewBoot`), Running at `now`: how long the node still
/// has to come back with a new boot (the agent that starts there finishes the step), or,
/// past `stepTimeoutSeconds` from the attempt's start, why the task blocks: the message
/// names the node, the deadline and what to check. Pure.
pub(super) fn boot_deadline(
    task: &NodeTask,
    index: usize,
    status: &NodeTaskStatus,
    now: Timestamp,
) -> std::result::Result<Duration, String> {
    let step = &task.spec.steps[index].name;
    let timeout = task
        .spec
        .step_timeout_seconds
        .unwrap_or(DEFAULT_STEP_TIMEOUT_SECONDS);
    let entry = step_status(&status.steps, step);
    let Some(started) = entry.and_then(|s| s.started_at.as_ref()).map(|t| t.0) else {
        return Ok(Duration::from_secs(u64::from(timeout)));
    };
    let elapsed = now.duration_since(started).unsigned_abs();
    let limit = Duration::from_secs(u64::from(timeout));
    if elapsed < limit {
        return Ok(limit - elapsed);
    }
    let node = &task.spec.node_name;
    let asked = match entry.and_then(|s| s.reboot_requested_at.as_ref()) {
        Some(t) => format!("the reboot was asked for at {}", t.0),
        None => "its agent did not report the reboot asked for (the reboot, or the node, may have stopped it first)".to_owned(),
    };
    Err(format!(
        "node {node} is not back with a new boot {timeout}s (stepTimeoutSeconds) after step {step} started at {started}; {asked}. \
         Check the node's console (or its hypervisor), then its kubelet (`journalctl -u kubelet`) and its Bosun agent \
         (`kubectl -n bosun-system get pods -o wide --field-selector spec.nodeName={node}`); then retry (the step asks for \
         the reboot again) or skip (the node is left as it is)"
    ))
}

/// A Running step that reboots the node: blocks the task as `StepTimedOut` once the node
/// is past its deadline ([`boot_deadline`]), with the step Failed (code `boot-timeout`),
/// written under the step's controller manager (the agent's own fields, its recorded boot
/// identity among them, stay); otherwise asks to be looked at again at the deadline.
async fn keep_boot_deadline(
    ctx: &Context,
    task: &mut NodeTask,
    index: usize,
    status: &NodeTaskStatus,
) -> Result<Option<Duration>> {
    let message = match boot_deadline(task, index, status, Timestamp::now()) {
        Ok(left) => return Ok(Some(left)),
        Err(message) => message,
    };
    let name = task.name_any();
    let step = task.spec.steps[index].name.clone();
    let entry = step_status(&status.steps, &step)
        .cloned()
        .unwrap_or_default();
    let started = entry.started_at.map_or_else(Timestamp::now, |t| t.0);
    let StepResult { write, blocked, .. } = step_result(
        &step,
        entry.attempts,
        started,
        Timestamp::now(),
        StepOutcome::Failed {
            reason: BlockReason::StepTimedOut,
            code: "boot-timeout",
            message,
            retryable: true,
        },
    );
    let written = write.steps[0].clone();
    tracing::warn!(node = %task.spec.node_name, step = %step, "the node is not back with a new boot within the step's deadline; the task blocks");
    apply_task_status(ctx, &name, write, &step_manager(&ctx.manager, &step)).await?;
    if let Some((reason, message)) = blocked {
        let next = task_transition(status.phase, TaskEvent::StepFailed)
            .map_err(bosun_cluster::Error::transition(&name))?;
        apply_task_status(
            ctx,
            &name,
            TaskStatusWrite::blocked(next, status.attempts, reason, &message),
            &ctx.manager,
        )
        .await?;
        mirror_step(task, &written);
        let s = task.status.get_or_insert_with(Default::default);
        s.phase = next;
        s.message = Some(message);
        s.reason = Some(reason);
    }
    Ok(None)
}

/// What a background advance of one task gives back: the task as it wrote it, and when to
/// look at it again (or the error).
type Advanced = (NodeTask, Result<Option<Duration>>);

/// Advances `task` (claimed in [`Context::inflight`]) in a job of its own
/// ([`advance_running_task`], under one of the shared permits), and answers on the returned
/// channel. Once the store shows what it wrote, the task is released. When nobody waits for
/// the answer any more (the reconcile carried on), the job wakes the Operation itself:
/// at once, after the wait the advance asked for (a drain in progress), or after
/// [`crate::inflight::RETRY_AFTER_ERROR`] when it failed.
pub(super) fn spawn_advance(
    ctx: Arc<Context>,
    op: Arc<Operation>,
    task: Arc<NodeTask>,
) -> tokio::sync::oneshot::Receiver<Advanced> {
    let (answer, answered) = tokio::sync::oneshot::channel();
    let span = tracing::Span::current();
    tokio::spawn(
        async move {
            let name = task.name_any();
            let permit = ctx.inflight.permits.clone().acquire_owned().await;
            // A job waiting for its permit holds the store's task, not a copy of it: at
            // 1,000 running tasks and 32 permits, that is 968 copies not made.
            let mut task = Arc::unwrap_or_clone(task);
            // Boxed: the advance's state lives on the heap only while it runs, so a job
            // that waits for its permit is a few hundred bytes, not the whole advance
            // (heaptrack at 1,000 waiting jobs: 7.4 MB).
            let result = Box::pin(advance_running_task(&ctx, &op, &mut task, None)).await;
            drop(permit);
            // A store that has not caught up in time makes the next reconcile read the tasks
            // from the API server (`Caches::tasks`), so releasing then is safe too.
            ctx.caches.caught_up(Writes::Of(&op.name_any())).await;
            ctx.inflight.release(&name);
            if let Err((task, result)) = answer.send((task, result)) {
                let wait = match result {
                    Ok(wait) => wait,
                    Err(e) => {
                        tracing::warn!(task = %name, error = %e, "advancing the task failed; looking again in 5s");
                        Some(crate::inflight::RETRY_AFTER_ERROR)
                    }
                };
                if let Some(wait) = wait {
                    tokio::time::sleep(wait).await;
                }
                if let Some(retrigger) = &ctx.retrigger {
                    let _ = retrigger.send(task);
                }
            }
        }
        .instrument(span),
    );
    answered
}

/// The writes an advance holds back until it knows what follows (see
/// [`advance_running_task`]).
#[derive(Debug, Default)]
struct Unwritten {
    /// The task's start (its top-level fields, from [`moved`]) when this pass starts it,
    /// until a step's write carries it.
    start: Option<serde_json::Value>,
    /// A finished controller step's write: its manager and body.
    step: Option<(String, serde_json::Value)>,
}

impl Unwritten {
    /// Holds back a finished step's write under `manager`, carrying the start when it was
    /// not written yet.
    fn hold(&mut self, manager: String, write: &TaskStatusWrite) -> Result<()> {
        let start = self.start.take();
        let mut body = serde_json::to_value(write).map_err(|source| Error::Serialize {
            what: "NodeTask status",
            source,
        })?;
        if let Some(start) = start {
            merge_into(&mut body, &start);
        }
        self.step = Some((manager, body));
        Ok(())
    }

    /// Writes the held step's write, if any.
    async fn flush_step(&mut self, ctx: &Context, name: &str) -> Result<()> {
        if let Some((manager, body)) = self.step.take() {
            apply_task_status(ctx, name, body, &manager).await?;
        }
        Ok(())
    }

    /// Writes what is held back: the held step's write (which carries the start, if it
    /// was held), else the start alone under the controller's own manager.
    async fn flush(&mut self, ctx: &Context, name: &str) -> Result<()> {
        self.flush_step(ctx, name).await?;
        if let Some(start) = self.start.take() {
            apply_task_status(ctx, name, start, &ctx.manager).await?;
        }
        Ok(())
    }
}

/// For a Running task: runs the controller-side steps that are next, in order, one pass
/// each ([`crate::actions::run_step`]: a drain or a wait that is not done yet stays Running
/// and asks to be looked at again); once every step succeeded, checks the health gates
/// ([`crate::health::look`]), and moves the task to Succeeded only when they pass (or to
/// Blocked, `HealthGateFailed`, when they do not in time). Agent steps are left to the agent.
/// Updates `task`'s status in memory to what was written. Returns when to look again, when
/// that should be sooner than the resync.
///
/// `start` is the task's start (its top-level fields, from [`moved`]) when this pass
/// starts it and it was not written yet.
///
/// Writes: a controller step that finished is written once, with its start and end. Its
/// write is held back ([`Unwritten`]) until the pass knows what follows, so that it
/// carries the task's start when it is the task's first write in this pass, and the task's
/// move to Succeeded (with the `HealthGates` condition that says the gates passed) when the
/// task ends in this pass. Such a write goes under the step's own manager
/// (`<manager>.step.<name>`), which then also holds those top-level fields: no later write
/// of that manager omits them while it is their only owner (the next top-level write, the
/// agent's or the controller's own, takes them over with a new value, and a finished task
/// is not written by a step manager again). One step entry per write, so every entry keeps
/// its own manager.
pub(super) async fn advance_running_task(
    ctx: &Context,
    op: &Operation,
    task: &mut NodeTask,
    start: Option<serde_json::Value>,
) -> Result<Option<Duration>> {
    let name = task.name_any();
    let mut unwritten = Unwritten { start, step: None };
    loop {
        let status = task.status.clone().unwrap_or_default();
        match progress(&task.spec.steps, &status.steps) {
            Progress::Done => return finish(ctx, op, task, &status, &mut unwritten).await,
            // Paused: a step in progress goes on, no new one starts.
            Progress::Next {
                runs_on: RunsOn::Controller,
                ..
            } if op.spec.paused => {
                unwritten.flush(ctx, &name).await?;
                return Ok(None);
            }
            Progress::Next {
                index,
                runs_on: RunsOn::Controller,
            } if task.spec.dry_run => {
                dry_run_step(ctx, task, index, &status, &mut unwritten).await?;
            }
            Progress::Next {
                index,
                runs_on: RunsOn::Controller,
            }
            | Progress::Running {
                index,
                runs_on: RunsOn::Controller,
            } => {
                if let ControlFlow::Break(recheck) =
                    run_controller_step(ctx, op, task, index, &status, &mut unwritten).await?
                {
                    return Ok(recheck);
                }
            }
            // A step that reboots the node: the agent after the reboot finishes it; the
            // controller keeps its deadline.
            Progress::Running {
                index,
                runs_on: RunsOn::Agent,
            } if task.spec.steps[index].await_new_boot => {
                unwritten.flush(ctx, &name).await?;
                return keep_boot_deadline(ctx, task, index, &status).await;
            }
            // The agent's turn, an agent step in flight, or a failure waiting for a person.
            Progress::Next {
                runs_on: RunsOn::Agent,
                ..
            }
            | Progress::Running {
                runs_on: RunsOn::Agent,
                ..
            }
            | Progress::Failed { .. } => {
                unwritten.flush(ctx, &name).await?;
                return Ok(None);
            }
        }
    }
}

/// Every step succeeded: the health gates decide. While they wait, what is held back is
/// written, with the condition that names the gate holding the rollout. Their verdict moves
/// the task to Succeeded, or to Blocked (`HealthGateFailed`). Succeeded is one write: the
/// last step (if not written yet), the gates' condition and the task's end, under the
/// manager of what it carries.
async fn finish(
    ctx: &Context,
    op: &Operation,
    task: &mut NodeTask,
    status: &NodeTaskStatus,
    unwritten: &mut Unwritten,
) -> Result<Option<Duration>> {
    let name = task.name_any();
    let (condition, verdict) = crate::health::look(&ctx.client, &op.spec.health_gates, task).await;
    let (event, reason) = match verdict {
        crate::health::Verdict::Wait(d) => {
            unwritten.flush(ctx, &name).await?;
            if let Some(c) = &condition {
                // Which gate holds the rollout, each time that changes: the condition itself
                // is overwritten once the gates pass.
                tracing::info!(
                    node = %task.spec.node_name,
                    reason = %c.reason,
                    detail = %c.message,
                    "health gates"
                );
                crate::health::write_condition(&ctx.client, &ctx.manager, task, c).await?;
            }
            return Ok(Some(d));
        }
        crate::health::Verdict::Fail(message) => {
            record_health_gate(status);
            (
                TaskEvent::StepFailed,
                Some((BlockReason::HealthGateFailed, message)),
            )
        }
        crate::health::Verdict::Pass => {
            record_health_gate(status);
            (TaskEvent::StepsDone, None)
        }
    };
    let (next, top) = moved(task, event, reason)?;
    if next == NodeTaskPhase::Succeeded {
        let manager = match (&unwritten.step, &condition) {
            (Some((m, _)), _) => m.clone(),
            (None, Some(_)) => crate::health::manager(&ctx.manager),
            (None, None) => ctx.manager.clone(),
        };
        let mut body = unwritten.step.take().map_or_else(|| json!({}), |(_, b)| b);
        merge_into(&mut body, &top);
        if let Some(c) = &condition {
            body["conditions"] = json!([c]);
        }
        // A start not written yet (none is: a started task has a step first) is said again
        // by the end's fields.
        apply_task_status(ctx, &name, body, &manager).await?;
    } else {
        unwritten.flush(ctx, &name).await?;
        if let Some(c) = &condition {
            crate::health::write_condition(&ctx.client, &ctx.manager, task, c).await?;
        }
        apply_task_status(ctx, &name, top.clone(), &ctx.manager).await?;
    }
    mirror_top(task, next, &top);
    if let Some(c) = condition {
        let s = task.status.get_or_insert_with(Default::default);
        s.conditions.retain(|x| x.type_ != c.type_);
        s.conditions.push(c);
    }
    tracing::info!(node = %task.spec.node_name, phase = ?next, "NodeTask finished its steps");
    Ok(None)
}

/// A dry run changes no node: the controller step at `index` says what it would do, and
/// is held back as a finished step.
async fn dry_run_step(
    ctx: &Context,
    task: &mut NodeTask,
    index: usize,
    status: &NodeTaskStatus,
    unwritten: &mut Unwritten,
) -> Result<()> {
    unwritten.flush_step(ctx, &task.name_any()).await?;
    let step = task.spec.steps[index].clone();
    let at = Timestamp::now();
    let message = format!(
        "dry run: would {} node {}",
        step.action, task.spec.node_name
    );
    let entry = StepWrite::finished(
        &step.name,
        step_attempts(status, &step.name) + 1,
        at,
        at,
        StepEnd {
            phase: StepPhase::Succeeded,
            changed: false,
            message,
            error: None,
        },
        None,
    );
    unwritten.hold(
        step_manager(&ctx.manager, &step.name),
        &TaskStatusWrite::step(entry.clone()),
    )?;
    mirror_step(task, &entry);
    Ok(())
}

/// Runs the controller step at `index` for one pass ([`crate::actions::run_step`]). A step
/// already Running is a drain or wait in progress: same clock, same attempt. A step that
/// finished is held back; one in progress or failed is written now (after what was held,
/// the start first and alone), and a failure blocks the task. `Break` ends the advance with
/// when to look again; `Continue` goes on to the next step.
async fn run_controller_step(
    ctx: &Context,
    op: &Operation,
    task: &mut NodeTask,
    index: usize,
    status: &NodeTaskStatus,
    unwritten: &mut Unwritten,
) -> Result<ControlFlow<Option<Duration>>> {
    let name = task.name_any();
    unwritten.flush_step(ctx, &name).await?;
    let step = task.spec.steps[index].clone();
    let prior = step_status(&status.steps, &step.name)
        .filter(|s| s.phase == StepPhase::Running)
        .cloned();
    let started = prior
        .as_ref()
        .and_then(|s| s.started_at.as_ref())
        .map_or_else(Timestamp::now, |t| t.0);
    let attempts = prior
        .as_ref()
        .map_or_else(|| step_attempts(status, &step.name) + 1, |p| p.attempts);
    let span =
        tracing::info_span!("step", node = %task.spec.node_name, step = %step.name, plugin = "");
    let known = ctx.caches.node(&task.spec.node_name);
    let outcome = crate::actions::run_step(
        &ctx.client,
        &ctx.events,
        &op.spec,
        task,
        &step,
        started,
        known.as_deref(),
    )
    .instrument(span)
    .await;
    let finished = Timestamp::now();
    record_step_finished(&outcome, started);
    let StepResult {
        write,
        recheck,
        blocked,
    } = step_result(&step.name, attempts, started, finished, outcome);
    let entry = write.steps[0].clone();
    let manager = step_manager(&ctx.manager, &step.name);
    if recheck.is_none() && blocked.is_none() {
        // Done: held back, to be carried with what follows.
        unwritten.hold(manager, &write)?;
    } else {
        // The start, if not written yet, goes first and alone (a step in progress writes
        // again under its manager without the task's fields).
        unwritten.flush(ctx, &name).await?;
        // An in-progress step that reports the same as last time writes nothing: the write
        // would wake this controller again at once.
        let unchanged =
            recheck.is_some() && prior.as_ref().is_some_and(|p| p.message == entry.message);
        if !unchanged {
            apply_task_status(ctx, &name, write, &manager).await?;
        }
    }
    if let Some((reason, message)) = &blocked {
        let current = task.status.clone().unwrap_or_default();
        let next = task_transition(current.phase, TaskEvent::StepFailed)
            .map_err(bosun_cluster::Error::transition(&name))?;
        apply_task_status(
            ctx,
            &name,
            TaskStatusWrite::blocked(next, current.attempts, *reason, message),
            &ctx.manager,
        )
        .await?;
    }
    // Mirror the write in memory, then look at the next step.
    mirror_step(task, &entry);
    if let Some((reason, message)) = blocked {
        let s = task.status.get_or_insert_with(Default::default);
        s.phase = NodeTaskPhase::Blocked;
        s.message = Some(message);
        s.reason = Some(reason);
        return Ok(ControlFlow::Break(None));
    }
    if recheck.is_some() {
        return Ok(ControlFlow::Break(recheck));
    }
    Ok(ControlFlow::Continue(()))
}

/// What one pass of a controller step comes to: the step's write, when to look again (the
/// step is in progress), and the task's block (the step failed).
#[derive(Debug)]
struct StepResult {
    write: TaskStatusWrite,
    recheck: Option<Duration>,
    blocked: Option<(BlockReason, String)>,
}

/// The write and the consequences of a controller step's `outcome` (pure).
fn step_result(
    step: &str,
    attempts: u32,
    started: Timestamp,
    finished: Timestamp,
    outcome: StepOutcome,
) -> StepResult {
    let end = |end: StepEnd| {
        TaskStatusWrite::step(StepWrite::finished(
            step, attempts, started, finished, end, None,
        ))
    };
    match outcome {
        StepOutcome::Succeeded { message, changed } => StepResult {
            write: end(StepEnd {
                phase: StepPhase::Succeeded,
                changed,
                message,
                error: None,
            }),
            recheck: None,
            blocked: None,
        },
        StepOutcome::InProgress { message, recheck } => StepResult {
            write: TaskStatusWrite::step_progress(step, attempts, started, &message),
            recheck: Some(recheck),
            blocked: None,
        },
        StepOutcome::Failed {
            reason,
            code,
            message,
            retryable,
        } => StepResult {
            blocked: Some((reason, format!("step {step}: {message}"))),
            write: end(StepEnd {
                phase: StepPhase::Failed,
                changed: false,
                message: message.clone(),
                error: Some(StepError {
                    code: code.to_string(),
                    message,
                    retryable,
                }),
            }),
            recheck: None,
        },
    }
}

/// Counts a controller step that ended (succeeded or failed) in
/// `bosun_step_duration_seconds`; one still in progress is not counted yet.
fn record_step_finished(outcome: &StepOutcome, started: Timestamp) {
    let block = match outcome {
        StepOutcome::Succeeded { .. } => None,
        StepOutcome::Failed { reason, .. } => Some(*reason),
        StepOutcome::InProgress { .. } => return,
    };
    bosun_telemetry::metrics().step_finished(
        bosun_telemetry::Side::Controller,
        bosun_telemetry::StepOutcome::from_block(block),
        Timestamp::now().duration_since(started).unsigned_abs(),
    );
}

/// Mirrors a step entry written (or held back) in the task's status in memory.
fn mirror_step(task: &mut NodeTask, entry: &StepWrite) {
    let s = task.status.get_or_insert_with(Default::default);
    s.steps.retain(|x| x.name != entry.name);
    s.steps.push(entry.to_status());
}

/// Copies `fields`' top-level fields into `body` (both JSON objects); a field in both is
/// `fields`' (the task's own `message` over a step write's).
fn merge_into(body: &mut serde_json::Value, fields: &serde_json::Value) {
    if let (Some(body), Some(fields)) = (body.as_object_mut(), fields.as_object()) {
        for (k, v) in fields {
            body.insert(k.clone(), v.clone());
        }
    }
}

/// Records how long the health gates held a task: from its last step's finish to the gates'
/// verdict (pass or fail), for `bosun_gate_duration_seconds{gate="health"}`.
fn record_health_gate(status: &NodeTaskStatus) {
    if let Some(last) = status
        .steps
        .iter()
        .filter_map(|s| s.finished_at.as_ref())
        .map(|t| t.0)
        .max()
    {
        bosun_telemetry::metrics().gate_finished(
            bosun_telemetry::Gate::Health,
            Timestamp::now().duration_since(last).unsigned_abs(),
        );
    }
}

fn step_attempts(status: &NodeTaskStatus, step: &str) -> u32 {
    step_status(&status.steps, step).map_or(0, |s| s.attempts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    /// The deadline of a step that reboots the node, as a table: time left, or the block's
    /// message, which names the node, the deadline and what to check.
    #[test]
    fn a_reboot_step_has_until_its_timeout_for_the_new_boot() {
        use bosun_api::node_task::{NodeTaskSpec, StepStatus};
        use bosun_api::operation::Step;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let task = |timeout: Option<u32>| {
            let mut t = NodeTask::new(
                "rb-w1",
                NodeTaskSpec {
                    operation: "rb".into(),
                    node_name: "w1".into(),
                    group: "workers".into(),
                    steps: vec![Step {
                        name: "reboot".into(),
                        runs_on: RunsOn::Agent,
                        plugin: Some("reboot".into()),
                        action: "reboot".into(),
                        params: None,
                        await_new_boot: true,
                    }],
                    dry_run: false,
                    step_timeout_seconds: timeout,
                    approve: false,
                    recovery: None,
                },
            );
            t.status = Some(NodeTaskStatus::default());
            t
        };
        let status = |started: Option<&str>, asked: Option<&str>| NodeTaskStatus {
            phase: NodeTaskPhase::Running,
            steps: vec![StepStatus {
                name: "reboot".into(),
                phase: StepPhase::Running,
                attempts: 1,
                started_at: started.map(|s| Time(at(s))),
                boot_id: Some("a/1".into()),
                reboot_requested_at: asked.map(|s| Time(at(s))),
                ..StepStatus::default()
            }],
            ..NodeTaskStatus::default()
        };
        let now = at("2026-12-05T10:10:00Z");
        // (timeout, started, asked for, expected: Ok(seconds left) or Err(parts of the message))
        type Case<'a> = (
            Option<u32>,
            Option<&'a str>,
            Option<&'a str>,
            std::result::Result<u64, &'a [&'a str]>,
        );
        let cases: [Case<'_>; 5] = [
            (
                Some(900),
                Some("2026-12-05T10:00:00Z"),
                Some("2026-12-05T10:00:03Z"),
                Ok(300),
            ),
            // The default, 1800 s.
            (None, Some("2026-12-05T10:00:00Z"), None, Ok(1200)),
            // Not started as far as the status says: the whole timeout, to look again.
            (Some(60), None, None, Ok(60)),
            (
                Some(600),
                Some("2026-12-05T10:00:00Z"),
                Some("2026-12-05T10:00:03Z"),
                Err(&[
                    "node w1 is not back with a new boot 600s (stepTimeoutSeconds) after step reboot started at 2026-12-05T10:00:00Z",
                    "the reboot was asked for at 2026-12-05T10:00:03Z",
                    "journalctl -u kubelet",
                    "--field-selector spec.nodeName=w1",
                    "then retry (the step asks for the reboot again) or skip",
                ]),
            ),
            (
                Some(600),
                Some("2026-12-05T09:00:00Z"),
                None,
                Err(&["its agent did not report the reboot asked for"]),
            ),
        ];
        for (timeout, started, asked, expected) in cases {
            let got = boot_deadline(&task(timeout), 0, &status(started, asked), now);
            match (got, expected) {
                (Ok(left), Ok(secs)) => assert_eq!(left, Duration::from_secs(secs)),
                (Err(message), Err(parts)) => {
                    for part in parts {
                        assert!(message.contains(part), "{part:?} not in {message}");
                    }
                }
                (got, expected) => {
                    panic!("{timeout:?} {started:?}: got {got:?}, expected {expected:?}")
                }
            }
        }
    }

    /// Each outcome of a controller step, as a table: what it writes, whether the advance
    /// looks again, and whether the task blocks.
    #[test]
    fn a_step_outcome_becomes_one_write_and_its_consequence() {
        let (started, finished) = (at("2026-12-05T10:00:00Z"), at("2026-12-05T10:00:07Z"));
        let cases = [
            (
                StepOutcome::Succeeded {
                    message: "node w1 cordoned".into(),
                    changed: true,
                },
                StepPhase::Succeeded,
                None,
                None,
            ),
            (
                StepOutcome::InProgress {
                    message: "waiting for 2 pods to leave".into(),
                    recheck: Duration::from_secs(2),
                },
                StepPhase::Running,
                Some(Duration::from_secs(2)),
                None,
            ),
            (
                StepOutcome::Failed {
                    reason: BlockReason::StepFailed,
                    code: "DrainTimeout",
                    message: "pods still running".into(),
                    retryable: true,
                },
                StepPhase::Failed,
                None,
                Some((
                    BlockReason::StepFailed,
                    "step drain: pods still running".to_string(),
                )),
            ),
        ];
        for (outcome, phase, recheck, blocked) in cases {
            let what = format!("{outcome:?}");
            let r = step_result("drain", 3, started, finished, outcome);
            assert_eq!(r.write.steps.len(), 1, "{what}");
            let entry = &r.write.steps[0];
            assert_eq!(
                (entry.name.as_str(), entry.phase, entry.attempts),
                ("drain", phase, 3),
                "{what}"
            );
            assert_eq!(r.recheck, recheck, "{what}");
            assert_eq!(r.blocked, blocked, "{what}");
            let status = entry.to_status();
            assert_eq!(
                status.started_at.map(|t| t.0),
                Some(started),
                "{what}: the step's clock starts when it started"
            );
            let ended = phase != StepPhase::Running;
            assert_eq!(
                status.finished_at.map(|t| t.0),
                ended.then_some(finished),
                "{what}: only an ended step has a finish"
            );
            assert_eq!(
                status.error.map(|e| e.code),
                (phase == StepPhase::Failed).then(|| "DrainTimeout".to_string()),
                "{what}"
            );
        }
    }

    #[test]
    fn a_held_step_carries_the_start_and_the_start_is_held_once() {
        let mut unwritten = Unwritten {
            start: Some(json!({ "phase": "Running", "attempts": 1, "message": "running" })),
            step: None,
        };
        let write =
            TaskStatusWrite::step_progress("cordon", 1, at("2026-12-05T10:00:00Z"), "cordoning");
        unwritten.hold("bosun.step.cordon".into(), &write).unwrap();
        let (manager, body) = unwritten.step.clone().unwrap();
        assert_eq!(manager, "bosun.step.cordon");
        assert_eq!(body["phase"], "Running");
        assert_eq!(body["message"], "running", "the task's own message wins");
        assert_eq!(body["steps"][0]["name"], "cordon");
        assert!(
            unwritten.start.is_none(),
            "the start is now the step's to write"
        );
        unwritten.hold("bosun.step.drain".into(), &write).unwrap();
        let (_, body) = unwritten.step.unwrap();
        assert!(
            body.get("attempts").is_none(),
            "a second held step does not carry the start again: {body}"
        );
    }
}
