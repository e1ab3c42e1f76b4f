//! What happens to a Blocked NodeTask: a person's `spec.recovery` (Retry or Skip), the
//! Operation's `failurePolicy: Retry` (automatic retries with a doubling backoff), and
//! `spec.paused` mirrored onto the tasks so agents start no new step.
//!
//! The decisions are [`bosun_planner::state::resume`] and
//! [`bosun_planner::state::auto_retry`]; this module reads the task, asks, and writes the
//! answer. Nothing here sleeps: a retry that is not due yet returns how long to wait, and
//! the reconciler requeues.

use std::time::Duration;

use bosun_api::node_task::{NodeTask, NodeTaskPhase, Recovery};
use bosun_api::operation::Operation;
use bosun_planner::state::{AutoRetry, Resumer, Resumption, auto_retry, resume};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::error::{Error, Result};
use crate::reconcile::{Context, apply_task_status};

/// The annotation the controller puts on an Operation's unfinished NodeTasks while the
/// Operation is paused (`"true"`); agents start no new step of a task that has it.
pub const PAUSED_ANNOTATION: &str = "bosun.dev/paused";

/// True when the task carries [`PAUSED_ANNOTATION`].
pub fn is_paused(task: &NodeTask) -> bool {
    task.annotations().get(PAUSED_ANNOTATION).is_some_and(|v| v == "true")
}

/// Acts on one task: a person's `spec.recovery` first, else `failurePolicy: Retry`.
/// Updates `task` in memory to what was written. Returns how long until an automatic
/// retry is due, when one is waiting for its backoff.
///
/// Guarantees: a recovery is acted on at most once: `spec.recovery` is cleared before the
/// status is written (a failed clear acts on nothing); a recovery on a task that is not
/// Blocked changes nothing but is cleared and, unless the task is Running, explained in
/// its message.
pub async fn handle(ctx: &Context, op: &Operation, task: &mut NodeTask, now: Timestamp) -> Result<Option<Duration>> {
    let status = task.status.clone().unwrap_or_default();
    if let Some(recovery) = task.spec.recovery {
        // Cleared before acting: if the clear is refused, nothing is done (and the error is
        // retried); if acting then fails, the person sets it again. Acting first would
        // repeat the retry on every reconcile whenever the clear keeps failing.
        clear_recovery(ctx, task).await?;
        match resume(&task.spec.steps, &status, recovery, Resumer::Person) {
            Ok(resumption) => {
                write(ctx, task, &resumption, recovery).await?;
                tracing::info!(task = %task.name_any(), ?recovery, "recovery applied");
            }
            Err(e) => {
                tracing::warn!(task = %task.name_any(), ?recovery, phase = ?status.phase, "recovery ignored: {e}");
                if !status.phase.is_finished() && status.phase != NodeTaskPhase::Running {
                    let message = format!("spec.recovery {recovery:?} was ignored and cleared: {e}");
                    let body = json!({ "phase": status.phase, "attempts": status.attempts, "message": message });
                    apply_task_status(ctx, &task.name_any(), body, &ctx.manager).await?;
                    task.status.get_or_insert_with(Default::default).message = Some(message);
                }
            }
        }
        return Ok(None);
    }
    if status.phase != NodeTaskPhase::Blocked {
        return Ok(None);
    }
    match auto_retry(&op.spec.failure_policy, &task.spec.steps, &status, now) {
        AutoRetry::Now { retry, limit } => {
            let resumption = resume(&task.spec.steps, &status, Recovery::Retry, Resumer::Automatic { retry, limit })
                .map_err(|source| Error::Transition { task: task.name_any(), source })?;
            write(ctx, task, &resumption, Recovery::Retry).await?;
            tracing::info!(task = %task.name_any(), retry, limit, "automatic retry");
            Ok(None)
        }
        AutoRetry::Later { at, retry, limit } => {
            if let Some(failed) = failure(task) {
                note(ctx, task, format!("{failed}; failurePolicy Retry: automatic retry {retry} of {limit} at {at}")).await?;
            }
            let wait = at.duration_since(now).unsigned_abs();
            Ok(Some(wait.max(Duration::from_millis(100))))
        }
        AutoRetry::No { why } if !why.is_empty() => {
            // Only about a failed step: a task blocked otherwise (a health gate) keeps the
            // message that says why.
            if let Some(failed) = failure(task) {
                note(ctx, task, format!("{failed}; no automatic retry: {why}; set spec.recovery (Retry or Skip)")).await?;
            }
            Ok(None)
        }
        AutoRetry::No { .. } => Ok(None),
    }
}

/// The failed step and its message: the part of a task's message a retry note keeps. Built
/// from the step's entry, never from the task's message, so notes do not pile up.
fn failure(task: &NodeTask) -> Option<String> {
    let status = task.status.clone().unwrap_or_default();
    let failed = status
        .steps
        .iter()
        .filter(|s| task.spec.steps.iter().any(|spec| spec.name == s.name))
        .find(|s| s.phase == bosun_api::node_task::StepPhase::Failed);
    failed.map(|s| format!("step {} failed: {}", s.name, s.message.clone().unwrap_or_default()))
}

/// Sets the task's message (same phase and attempts), unless it already says that.
async fn note(ctx: &Context, task: &mut NodeTask, message: String) -> Result<()> {
    let status = task.status.clone().unwrap_or_default();
    if status.message.as_deref() == Some(message.as_str()) {
        return Ok(());
    }
    let body = json!({ "phase": status.phase, "attempts": status.attempts, "message": message });
    apply_task_status(ctx, &task.name_any(), body, &ctx.manager).await?;
    task.status.get_or_insert_with(Default::default).message = Some(message);
    Ok(())
}

/// Writes a resumption: the step's entry (under the step's controller field manager, so
/// the agent's next write of the step takes its fields back), the task's phase, attempts
/// and message, and for a retry removes the task's `reason` (it no longer applies).
async fn write(ctx: &Context, task: &mut NodeTask, r: &Resumption, recovery: Recovery) -> Result<()> {
    let name = task.name_any();
    if let Some(step) = &r.step {
        let entry = json!({ "name": step.name, "phase": step.phase, "attempts": step.attempts, "message": step.message });
        apply_task_status(ctx, &name, json!({ "currentStep": step.name, "steps": [entry] }), &format!("{}.step.{}", ctx.manager, step.name))
            .await?;
    }
    apply_task_status(ctx, &name, json!({ "phase": r.phase, "attempts": r.attempts, "message": r.message }), &ctx.manager).await?;
    if recovery == Recovery::Retry {
        let api: Api<NodeTask> = Api::all(ctx.client.clone());
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({ "status": { "reason": null } })))
            .await
            .map_err(Error::kube(format!("removing the block reason of NodeTask {name}")))?;
    }
    // Mirror in memory.
    let s = task.status.get_or_insert_with(Default::default);
    s.phase = r.phase;
    s.attempts = r.attempts;
    s.message = Some(r.message.clone());
    if recovery == Recovery::Retry {
        s.reason = None;
    }
    if let Some(step) = &r.step {
        let existing = s.steps.iter_mut().find(|x| x.name == step.name);
        match existing {
            Some(x) => {
                x.phase = step.phase;
                x.message = Some(step.message.clone());
            }
            None => s.steps.push(bosun_api::node_task::StepStatus {
                name: step.name.clone(),
                phase: step.phase,
                attempts: step.attempts,
                message: Some(step.message.clone()),
                ..Default::default()
            }),
        }
    }
    Ok(())
}

/// Removes `spec.recovery` (a JSON merge patch with null), so the same decision is never
/// applied twice and a person can set it again after the next failure.
async fn clear_recovery(ctx: &Context, task: &mut NodeTask) -> Result<()> {
    let name = task.name_any();
    let api: Api<NodeTask> = Api::all(ctx.client.clone());
    api.patch(&name, &PatchParams::default(), &Patch::Merge(json!({ "spec": { "recovery": null } })))
        .await
        .map_err(Error::kube(format!("clearing spec.recovery of NodeTask {name}")))?;
    task.spec.recovery = None;
    Ok(())
}

/// Puts [`PAUSED_ANNOTATION`] on the task while `paused`, and removes it otherwise.
/// Finished tasks are left alone.
pub async fn mirror_pause(ctx: &Context, task: &mut NodeTask, paused: bool) -> Result<()> {
    let finished = task.status.as_ref().is_some_and(|s| s.phase.is_finished());
    if finished || is_paused(task) == paused {
        return Ok(());
    }
    let name = task.name_any();
    let value = if paused { json!("true") } else { serde_json::Value::Null };
    let api: Api<NodeTask> = Api::all(ctx.client.clone());
    api.patch(&name, &PatchParams::default(), &Patch::Merge(json!({ "metadata": { "annotations": { PAUSED_ANNOTATION: value } } })))
        .await
        .map_err(Error::kube(format!("marking NodeTask {name} paused={paused}")))?;
    let annotations = task.metadata.annotations.get_or_insert_with(Default::default);
    if paused {
        annotations.insert(PAUSED_ANNOTATION.to_string(), "true".to_string());
    } else {
        annotations.remove(PAUSED_ANNOTATION);
    }
    Ok(())
}
