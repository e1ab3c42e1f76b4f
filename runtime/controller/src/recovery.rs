//! What happens to a Blocked NodeTask: a person's `spec.recovery` (Retry or Skip), the
//! Operation's `failurePolicy: Retry` (automatic retries with a doubling backoff), and
//! `spec.paused` mirrored onto the tasks so agents start no new step.
//!
//! The decisions are [`bosun_planner::state::resume`] and
//! [`bosun_planner::state::auto_retry`]; this module reads the task, asks, and writes the
//! answer. Nothing here sleeps: a retry that is not due yet returns how long to wait, and
//! the reconciler requeues.

use std::time::Duration;

// The annotation the controller puts on an Operation's unfinished NodeTasks while the
// Operation is paused (`"true"`); agents start no new step of a task that has it.
use bosun_api::labels::annotations::PAUSED as PAUSED_ANNOTATION;
use bosun_api::node_task::{NodeTask, NodeTaskPhase, Recovery};
use bosun_api::operation::Operation;
use bosun_cluster::is_paused;
use bosun_cluster::status::TaskStatusWrite;
use bosun_planner::state::{AutoRetry, Resumer, Resumption, auto_retry, resume};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::error::{Error, Result};
use crate::reconcile::{Context, apply_task_status};

/// Acts on one task: a person's `spec.recovery` first, else `failurePolicy: Retry`.
/// Updates `task` in memory to what was written. Returns how long until an automatic
/// retry is due, when one is waiting for its backoff.
///
/// Guarantees: a person's recovery is never lost and acted on at most once. The write
/// that acts (the task's phase) also records the task's `metadata.generation` in
/// `status.recoveryGeneration`; only after it landed is `spec.recovery` cleared. If acting
/// fails, `spec.recovery` is still set and the next reconcile acts; if the clear fails, the
/// next reconcile finds the recovery already recorded at this generation and only clears
/// it (a person setting `spec.recovery` again bumps the generation). A recovery on a task
/// that is not Blocked changes nothing but is recorded, cleared and, unless the task is
/// Running or finished, explained in its message.
pub async fn handle(
    ctx: &Context,
    op: &Operation,
    task: &mut NodeTask,
    now: Timestamp,
) -> Result<Option<Duration>> {
    if !wants_handling(task) {
        return Ok(None);
    }
    let status = task.status.clone().unwrap_or_default();
    if let Some(recovery) = task.spec.recovery {
        let generation = task.metadata.generation;
        if generation.is_some() && status.recovery_generation == generation {
            // Acted on in an earlier pass whose clear failed: clear only.
            clear_recovery(ctx, task).await?;
            return Ok(None);
        }
        match resume(&task.spec.steps, &status, recovery, Resumer::Person) {
            Ok(resumption) => {
                write(ctx, task, &resumption, recovery, generation).await?;
                tracing::info!(task = %task.name_any(), ?recovery, "recovery applied");
            }
            Err(e) => {
                tracing::warn!(task = %task.name_any(), ?recovery, phase = ?status.phase, "recovery ignored: {e}");
                let explain = !status.phase.is_finished() && status.phase != NodeTaskPhase::Running;
                let message = if explain {
                    Some(format!(
                        "spec.recovery {recovery:?} was ignored and cleared: {e}"
                    ))
                } else {
                    status.message.clone()
                };
                let body = TaskStatusWrite::task(status.phase, status.attempts, message.clone())
                    .with_reason(status.reason)
                    .with_recovery_generation(generation);
                apply_task_status(ctx, &task.name_any(), body, &ctx.manager).await?;
                let s = task.status.get_or_insert_with(Default::default);
                s.message = message;
                s.recovery_generation = generation;
            }
        }
        clear_recovery(ctx, task).await?;
        return Ok(None);
    }
    if status.phase != NodeTaskPhase::Blocked {
        return Ok(None);
    }
    match auto_retry(&op.spec.failure_policy, &task.spec.steps, &status, now) {
        AutoRetry::Now { retry, limit } => {
            let resumption = resume(
                &task.spec.steps,
                &status,
                Recovery::Retry,
                Resumer::Automatic { retry, limit },
            )
            .map_err(bosun_cluster::Error::transition(task.name_any()))?;
            write(ctx, task, &resumption, Recovery::Retry, None).await?;
            tracing::info!(task = %task.name_any(), retry, limit, "automatic retry");
            Ok(None)
        }
        AutoRetry::Later { at, retry, limit } => {
            if let Some(failed) = failure(task) {
                note(
                    ctx,
                    task,
                    format!(
                        "{failed}; failurePolicy Retry: automatic retry {retry} of {limit} at {at}"
                    ),
                )
                .await?;
            }
            let wait = at.duration_since(now).unsigned_abs();
            Ok(Some(wait.max(Duration::from_millis(100))))
        }
        AutoRetry::No { why } if !why.is_empty() => {
            // Only about a failed step: a task blocked otherwise (a health gate) keeps the
            // message that says why.
            if let Some(failed) = failure(task) {
                note(
                    ctx,
                    task,
                    format!(
                        "{failed}; no automatic retry: {why}; set spec.recovery (Retry or Skip)"
                    ),
                )
                .await?;
            }
            Ok(None)
        }
        AutoRetry::No { .. } => Ok(None),
    }
}

/// Whether [`handle`] has anything to do for `task`: a person's `spec.recovery` to act on,
/// or a Blocked task the failure policy may retry or explain. For any other task it reads
/// and writes nothing, so a reconcile need not copy the task to offer it.
pub fn wants_handling(task: &NodeTask) -> bool {
    task.spec.recovery.is_some()
        || task
            .status
            .as_ref()
            .is_some_and(|s| s.phase == NodeTaskPhase::Blocked)
}

/// Whether [`mirror_pause`] has to write `task`: it is unfinished and its paused mark
/// differs from the Operation's `paused`.
pub fn pause_differs(task: &NodeTask, paused: bool) -> bool {
    let finished = task.status.as_ref().is_some_and(|s| s.phase.is_finished());
    !finished && is_paused(task) != paused
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
    failed.map(|s| {
        format!(
            "step {} failed: {}",
            s.name,
            s.message.clone().unwrap_or_default()
        )
    })
}

/// Sets the task's message (same phase and attempts), unless it already says that.
async fn note(ctx: &Context, task: &mut NodeTask, message: String) -> Result<()> {
    let status = task.status.clone().unwrap_or_default();
    if status.message.as_deref() == Some(message.as_str()) {
        return Ok(());
    }
    let body = TaskStatusWrite::task(status.phase, status.attempts, Some(message.clone()));
    apply_task_status(ctx, &task.name_any(), body, &ctx.manager).await?;
    task.status.get_or_insert_with(Default::default).message = Some(message);
    Ok(())
}

/// Writes a resumption: the step's entry (under the step's controller field manager, so
/// the agent's next write of the step takes its fields back), for a retry the removal of
/// the task's `reason` (it no longer applies), and last the task's phase, attempts and
/// message with `recoveryGeneration` (`generation`, for a person's recovery): that last
/// write is the one that acts, so a failure before it leaves the task Blocked for the next
/// pass to act on again.
async fn write(
    ctx: &Context,
    task: &mut NodeTask,
    r: &Resumption,
    recovery: Recovery,
    generation: Option<i64>,
) -> Result<()> {
    let name = task.name_any();
    if let Some(step) = &r.step {
        apply_task_status(
            ctx,
            &name,
            TaskStatusWrite::step_resumed(&step.name, step.phase, step.attempts, &step.message),
            &bosun_cluster::status::step_manager(&ctx.manager, &step.name),
        )
        .await?;
    }
    if recovery == Recovery::Retry {
        bosun_cluster::status::clear_reason(&ctx.client, &name).await?;
    }
    let top = TaskStatusWrite::task(r.phase, r.attempts, Some(r.message.clone()))
        .with_recovery_generation(generation);
    apply_task_status(ctx, &name, top, &ctx.manager).await?;
    // Mirror in memory.
    let s = task.status.get_or_insert_with(Default::default);
    s.phase = r.phase;
    s.attempts = r.attempts;
    s.message = Some(r.message.clone());
    if generation.is_some() {
        s.recovery_generation = generation;
    }
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

/// Removes `spec.recovery`, so the same decision is never applied twice and a person can
/// set it again after the next failure — but only if the spec is still the one acted on: a
/// JSON Patch whose `test` on `metadata.generation` fails when a person changed the spec
/// (for example set `Skip` just after the controller read `Retry`). That newer recovery is
/// then left in place and handled on the next pass instead of being erased.
async fn clear_recovery(ctx: &Context, task: &mut NodeTask) -> Result<()> {
    let name = task.name_any();
    let api: Api<NodeTask> = Api::all(ctx.client.clone());
    let mut ops = Vec::new();
    if let Some(generation) = task.metadata.generation {
        ops.push(json!({ "op": "test", "path": "/metadata/generation", "value": generation }));
    }
    ops.push(json!({ "op": "remove", "path": "/spec/recovery" }));
    let patch: json_patch::Patch =
        serde_json::from_value(serde_json::Value::Array(ops)).expect("a well-formed JSON Patch");
    match api
        .patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => {}
        // The `test` failed (the spec changed since it was read) or the field is already
        // gone: nothing to clear now; a newer recovery is handled on the next pass.
        Err(kube::Error::Api(e)) if e.code == 422 || e.code == 409 => {
            tracing::info!(task = %name, "spec.recovery changed since it was read; leaving the newer one for the next pass");
            return Ok(());
        }
        Err(e) => {
            return Err(Error::kube(format!(
                "clearing spec.recovery of NodeTask {name}"
            ))(e));
        }
    }
    task.spec.recovery = None;
    Ok(())
}

/// Puts the pause annotation ([`bosun_api::labels::annotations::PAUSED`]) on the task while `paused`, and removes it otherwise.
/// Finished tasks are left alone.
pub async fn mirror_pause(ctx: &Context, task: &mut NodeTask, paused: bool) -> Result<()> {
    if !pause_differs(task, paused) {
        return Ok(());
    }
    let name = task.name_any();
    let value = if paused {
        json!("true")
    } else {
        serde_json::Value::Null
    };
    let api: Api<NodeTask> = Api::all(ctx.client.clone());
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "metadata": { "annotations": { PAUSED_ANNOTATION: value } } })),
    )
    .await
    .map_err(Error::kube(format!(
        "marking NodeTask {name} paused={paused}"
    )))?;
    let annotations = task
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    if paused {
        annotations.insert(PAUSED_ANNOTATION.to_string(), "true".to_string());
    } else {
        annotations.remove(PAUSED_ANNOTATION);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! One reconcile step of [`handle`] against a fake API server: which writes it makes,
    //! in which order, and what happens when one of them fails.

    use bosun_api::node_task::{NodeTaskSpec, NodeTaskStatus, StepStatus};
    use bosun_api::operation::{OperationSpec, RunsOn, Step};

    use super::*;
    use crate::fake_api::{Seen, context, fake, fake_failing_with};

    fn operation() -> Operation {
        Operation::new(
            "op",
            serde_json::from_value::<OperationSpec>(json!({ "custom": { "groups": [] } })).unwrap(),
        )
    }

    /// A task Blocked at its failed only step, with `spec.recovery: Retry` at generation 3.
    fn blocked_with_retry() -> NodeTask {
        let step: Step = serde_json::from_value(json!({ "name": "hello", "plugin": "hello", "action": "greet", "runsOn": RunsOn::Agent })).unwrap();
        let mut task = NodeTask::new(
            "op-w1",
            NodeTaskSpec {
                operation: "op".into(),
                node_name: "w1".into(),
                group: "workers".into(),
                steps: vec![step],
                dry_run: false,
                step_timeout_seconds: None,
                approve: false,
                recovery: Some(Recovery::Retry),
            },
        );
        task.metadata.generation = Some(3);
        task.status = Some(NodeTaskStatus {
            phase: NodeTaskPhase::Blocked,
            attempts: 1,
            reason: Some(bosun_api::node_task::BlockReason::StepFailed),
            message: Some("step hello failed: boom".into()),
            steps: vec![StepStatus {
                name: "hello".into(),
                phase: bosun_api::node_task::StepPhase::Failed,
                attempts: 1,
                ..Default::default()
            }],
            ..Default::default()
        });
        task
    }

    #[tokio::test]
    async fn a_retry_whose_clear_fails_is_recorded_first_and_not_acted_on_twice() {
        // Pass 1: acting succeeds, the clear fails.
        let mut task = blocked_with_retry();
        let (client, seen) = fake(&task, Seen::is_clear);
        let ctx = context(client);
        let result = handle(&ctx, &operation(), &mut task, Timestamp::now()).await;
        assert!(
            result.is_err(),
            "the failed clear is an error, retried by the reconciler"
        );
        let requests = seen.lock().unwrap().clone();
        let clear_at = requests
            .iter()
            .position(Seen::is_clear)
            .expect("the clear was attempted");
        let acted_at = requests
            .iter()
            .position(|r| {
                r.is_status() && r.body.pointer("/status/phase") == Some(&json!("Running"))
            })
            .expect("the task was moved to Running");
        assert!(acted_at < clear_at, "acted before clearing: {requests:#?}");
        assert_eq!(
            requests[acted_at]
                .body
                .pointer("/status/recoveryGeneration"),
            Some(&json!(3)),
            "the write that acts records the generation"
        );
        assert_eq!(
            task.spec.recovery,
            Some(Recovery::Retry),
            "still set: the clear failed"
        );

        // Pass 2: the server now holds what pass 1 wrote (Running, recoveryGeneration 3) and
        // still has spec.recovery; the clear works this time. Only the clear is sent.
        let mut task = blocked_with_retry();
        let status = task.status.as_mut().unwrap();
        status.phase = NodeTaskPhase::Running;
        status.recovery_generation = Some(3);
        let (client, seen) = fake(&task, |_| false);
        let ctx = context(client);
        handle(&ctx, &operation(), &mut task, Timestamp::now())
            .await
            .unwrap();
        let requests = seen.lock().unwrap().clone();
        assert_eq!(requests.len(), 1, "only the clear: {requests:#?}");
        assert!(requests[0].is_clear());
        assert_eq!(task.spec.recovery, None);

        // Even if the task blocked again before pass 2, the same recovery is not applied to
        // the new failure: it is the generation that was already acted on.
        let mut task = blocked_with_retry();
        task.status.as_mut().unwrap().recovery_generation = Some(3);
        let (client, seen) = fake(&task, |_| false);
        handle(&context(client), &operation(), &mut task, Timestamp::now())
            .await
            .unwrap();
        let requests = seen.lock().unwrap().clone();
        assert!(
            requests.iter().all(|r| !r.is_status()),
            "no status write: {requests:#?}"
        );
    }

    #[tokio::test]
    async fn a_retry_whose_status_write_fails_keeps_spec_recovery_for_the_next_pass() {
        let mut task = blocked_with_retry();
        let (client, seen) = fake(&task, |r| {
            r.is_status() && r.body.pointer("/status/phase").is_some()
        });
        let result = handle(&context(client), &operation(), &mut task, Timestamp::now()).await;
        assert!(result.is_err());
        let requests = seen.lock().unwrap().clone();
        assert!(
            !requests.iter().any(Seen::is_clear),
            "spec.recovery must not be cleared when acting failed: {requests:#?}"
        );
        assert_eq!(task.spec.recovery, Some(Recovery::Retry));

        // The next pass, with nothing changed on the server but the step entry, acts.
        let (client, seen) = fake(&task, |_| false);
        handle(&context(client), &operation(), &mut task, Timestamp::now())
            .await
            .unwrap();
        let requests = seen.lock().unwrap().clone();
        assert!(
            requests
                .iter()
                .any(|r| r.body.pointer("/status/phase") == Some(&json!("Running")))
        );
        assert!(
            requests.last().unwrap().is_clear(),
            "cleared last: {requests:#?}"
        );
        assert_eq!(task.spec.recovery, None);
        assert_eq!(task.status.as_ref().unwrap().phase, NodeTaskPhase::Running);
    }

    #[tokio::test]
    async fn a_recovery_changed_after_it_was_read_is_not_erased_by_the_clear() {
        // The controller read Retry at generation 3 and acts; meanwhile a person set Skip
        // (generation 4), so the clear's `test` of generation 3 fails with 422.
        let mut task = blocked_with_retry();
        let (client, seen) = fake_failing_with(&task, Seen::is_clear, 422);
        handle(&context(client), &operation(), &mut task, Timestamp::now())
            .await
            .expect("a failed test is not an error");
        let requests = seen.lock().unwrap().clone();
        let clear = requests
            .iter()
            .find(|r| r.is_clear())
            .expect("the clear was attempted");
        assert_eq!(
            clear.body[0],
            json!({ "op": "test", "path": "/metadata/generation", "value": 3 }),
            "{clear:#?}"
        );
        assert_eq!(
            task.spec.recovery,
            Some(Recovery::Retry),
            "left for the next pass, which reads the newer spec"
        );
    }

    #[tokio::test]
    async fn a_recovery_set_again_at_a_new_generation_is_acted_on() {
        let mut task = blocked_with_retry();
        task.metadata.generation = Some(5);
        task.status.as_mut().unwrap().recovery_generation = Some(3);
        let (client, seen) = fake(&task, |_| false);
        handle(&context(client), &operation(), &mut task, Timestamp::now())
            .await
            .unwrap();
        let requests = seen.lock().unwrap().clone();
        let acted = requests
            .iter()
            .find(|r| r.body.pointer("/status/phase") == Some(&json!("Running")))
            .expect("acted");
        assert_eq!(
            acted.body.pointer("/status/recoveryGeneration"),
            Some(&json!(5))
        );
        assert!(requests.last().unwrap().is_clear());
    }
}
