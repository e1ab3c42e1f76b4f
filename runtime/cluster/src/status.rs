//! NodeTask status writes, typed: what the agent and the controller write when a step
//! starts, reports progress, finishes or is found interrupted, and when a task blocks. Each
//! transition is one constructor; the JSON each gives is pinned by the tests below.
//!
//! Writes are server-side applies ([`apply`]). A step's entry is written with a field
//! manager per step (`<manager>.step.<name>`, see [`step_manager`]) and the task's top-level
//! fields with the writer's own manager, so no apply removes another's fields. Server-side
//! apply removes the fields a manager set before and leaves out now, so a constructor
//! writes every field its manager owns at that point, and leaves out the rest.
//!
//! To save writes, a step's write may carry what is due at the same moment, under the
//! step's manager: the agent's node-facts reports ([`TaskStatusWrite::with_facts`]; that
//! manager then carries them in each later write of its own), and the controller's task
//! start or end (see `bosun_controller::reconcile::advance_running_task`).
//!
//! Step times are written with microseconds ([`crate::time::precise`]), which
//! [`bosun_api::node_task::StepStatus`] (whole-second `Time`) cannot carry: that is why
//! these are their own types, not the status types.

use std::collections::BTreeMap;

use bosun_api::node_task::{
    BlockReason, NodeTask, NodeTaskPhase, PolicyDecision, PreflightCheck, StepError, StepPhase,
};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use serde_json::json;

use crate::time::precise;
use crate::{Error, Result};

/// One step's entry in a status write (`status.steps[]`, merged by `name`).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepWrite {
    pub name: String,
    pub phase: StepPhase,
    pub attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outputs: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_tail: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preflight: Option<Vec<PreflightCheck>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyDecision>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<StepError>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_milliseconds: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reboot_requested_at: Option<String>,
}

/// What a plugin step reported besides its outcome (the agent's steps only).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepReport {
    pub outputs: BTreeMap<String, String>,
    pub log_tail: Vec<String>,
    pub preflight: Vec<PreflightCheck>,
    pub policy: Option<PolicyDecision>,
    /// Milliseconds spent in granted host commands and service actions.
    pub host_milliseconds: u64,
}

/// How a step ended.
#[derive(Clone, Debug, PartialEq)]
pub struct StepEnd {
    /// Succeeded or Failed.
    pub phase: StepPhase,
    pub changed: bool,
    /// The one-line result.
    pub message: String,
    /// Why it failed.
    pub error: Option<StepError>,
}

impl StepWrite {
    fn bare(name: &str, phase: StepPhase, attempts: u32) -> StepWrite {
        StepWrite {
            name: name.to_string(),
            phase,
            attempts,
            started_at: None,
            finished_at: None,
            changed: None,
            message: None,
            outputs: None,
            log_tail: None,
            preflight: None,
            policy: None,
            error: None,
            host_milliseconds: None,
            boot_id: None,
            reboot_requested_at: None,
        }
    }

    /// The step as it ended, at `finished`, after starting at `started`; with `report` for a
    /// plugin step (its outputs, log tail, preflight results and policy decision).
    pub fn finished(
        name: &str,
        attempts: u32,
        started: Timestamp,
        finished: Timestamp,
        end: StepEnd,
        report: Option<StepReport>,
    ) -> StepWrite {
        let mut entry = StepWrite::bare(name, end.phase, attempts);
        entry.started_at = Some(precise(started));
        entry.finished_at = Some(precise(finished));
        entry.changed = Some(end.changed);
        entry.message = Some(end.message);
        entry.error = end.error;
        if let Some(report) = report {
            entry.outputs = Some(report.outputs);
            entry.log_tail = Some(report.log_tail);
            entry.preflight = Some(report.preflight);
            entry.policy = report.policy;
            entry.host_milliseconds = Some(report.host_milliseconds);
        }
        entry
    }

    /// What the entry says when read back as the status type (times at the precision a
    /// `Time` keeps), for a writer that mirrors its write in memory.
    pub fn to_status(&self) -> bosun_api::node_task::StepStatus {
        let time = |t: &Option<String>| {
            t.as_deref()
                .and_then(|t| t.parse::<Timestamp>().ok())
                .map(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time)
        };
        bosun_api::node_task::StepStatus {
            name: self.name.clone(),
            phase: self.phase,
            attempts: self.attempts,
            started_at: time(&self.started_at),
            finished_at: time(&self.finished_at),
            changed: self.changed,
            message: self.message.clone(),
            outputs: self.outputs.clone().unwrap_or_default(),
            log_tail: self.log_tail.clone().unwrap_or_default(),
            preflight: self.preflight.clone().unwrap_or_default(),
            policy: self.policy.clone(),
            error: self.error.clone(),
            host_milliseconds: self.host_milliseconds,
            boot_id: self.boot_id.clone(),
            reboot_requested_at: time(&self.reboot_requested_at),
        }
    }
}

/// A write of part of a NodeTask's status.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskStatusWrite {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<NodeTaskPhase>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_step: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<BlockReason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<StepWrite>,
    /// The node-facts reports this write carries (`status.nodeFacts`: `before`, `after`),
    /// for the agent's step writes (see [`TaskStatusWrite::with_facts`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_facts: Option<serde_json::Value>,
    /// The task's `metadata.generation` whose `spec.recovery` the controller acted on
    /// ([`TaskStatusWrite::with_recovery_generation`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recovery_generation: Option<i64>,
}

impl TaskStatusWrite {
    /// Attempt `attempts` of agent step `step` starts at `started`, in `phase` (Running, as
    /// the state machine says): written before the plugin runs, so a restart can tell an
    /// interrupted step. Under the step's manager.
    pub fn step_started(
        step: &str,
        phase: StepPhase,
        attempts: u32,
        started: Timestamp,
    ) -> TaskStatusWrite {
        let mut entry = StepWrite::bare(step, phase, attempts);
        entry.started_at = Some(precise(started));
        TaskStatusWrite {
            current_step: Some(step.to_string()),
            message: Some(format!("running step {step}")),
            steps: vec![entry],
            ..TaskStatusWrite::default()
        }
    }

    /// A controller step (a drain, a wait) still in progress since `started`, saying
    /// `message`. Under the step's manager.
    pub fn step_progress(
        step: &str,
        attempts: u32,
        started: Timestamp,
        message: &str,
    ) -> TaskStatusWrite {
        let mut entry = StepWrite::bare(step, StepPhase::Running, attempts);
        entry.started_at = Some(precise(started));
        entry.message = Some(message.to_string());
        TaskStatusWrite::step(entry)
    }

    /// A step that ended (`entry` from [`StepWrite::finished`]): the controller's write of
    /// its own steps, under the step's manager. The task's phase is the controller's to
    /// write, with [`TaskStatusWrite::blocked`].
    pub fn step(entry: StepWrite) -> TaskStatusWrite {
        TaskStatusWrite {
            current_step: Some(entry.name.clone()),
            steps: vec![entry],
            ..TaskStatusWrite::default()
        }
    }

    /// An agent step that ended (`entry` from [`StepWrite::finished`]), with the task's
    /// message; when it failed, `block` is the task's next phase (Blocked, as the state
    /// machine says) and why. Under the step's manager; a result whose write failed is
    /// sent again as it is.
    pub fn step_finished(
        entry: StepWrite,
        block: Option<(NodeTaskPhase, BlockReason)>,
    ) -> TaskStatusWrite {
        let step = entry.name.clone();
        let result = entry.message.clone().unwrap_or_default();
        let mut write = TaskStatusWrite::step(entry);
        match block {
            Some((phase, reason)) => {
                write.phase = Some(phase);
                write.reason = Some(reason);
                write.message = Some(format!("step {step} failed: {result}"));
            }
            None => write.message = Some(format!("step {step} succeeded: {result}")),
        }
        write
    }

    /// A step found Running that no process is running (the agent restarted during it): it
    /// keeps its attempt and start time, and moves to `phase` (Pending to run again when
    /// its action is idempotent, else Failed). Failed blocks the task: `block` is the task's
    /// next phase (Blocked) and when the step was found.
    pub fn step_interrupted(
        step: &str,
        phase: StepPhase,
        attempts: u32,
        started: Option<Timestamp>,
        block: Option<(NodeTaskPhase, Timestamp)>,
    ) -> TaskStatusWrite {
        let mut entry = StepWrite::bare(step, phase, attempts);
        entry.started_at = started.map(precise);
        let mut write = TaskStatusWrite {
            steps: vec![entry],
            ..TaskStatusWrite::default()
        };
        if let Some((next, found)) = block {
            write.phase = Some(next);
            write.reason = Some(BlockReason::Interrupted);
            write.message = Some(format!(
                "step {step} was interrupted by an agent restart and its action is not idempotent: check the node, then retry or skip"
            ));
            write.steps[0].finished_at = Some(precise(found));
            write.steps[0].message = Some("interrupted by an agent restart".to_string());
        }
        write
    }

    /// The task blocks: its `phase` (Blocked), `reason` and `message`, with its `attempts`
    /// (the controller's manager owns them). Under the controller's own manager.
    pub fn blocked(
        phase: NodeTaskPhase,
        attempts: u32,
        reason: BlockReason,
        message: &str,
    ) -> TaskStatusWrite {
        TaskStatusWrite::task(phase, attempts, Some(message.to_string())).with_reason(Some(reason))
    }
}

impl TaskStatusWrite {
    /// The task's own fields as the controller writes them when it changes no step: its
    /// `phase`, `attempts` and `message` (a note, a resumption's last write, an ignored
    /// recovery). Under the controller's own manager, which owns these fields.
    pub fn task(phase: NodeTaskPhase, attempts: u32, message: Option<String>) -> TaskStatusWrite {
        TaskStatusWrite {
            phase: Some(phase),
            attempts: Some(attempts),
            message,
            ..TaskStatusWrite::default()
        }
    }

    /// A step a recovery (a person's, or an automatic retry) moved back to `phase` (Pending
    /// to run again, Skipped), with its `attempts` and a `message` saying so; the task's
    /// current step becomes it. Under the step's controller manager, so the agent's next
    /// write of the step takes its fields back.
    pub fn step_resumed(
        step: &str,
        phase: StepPhase,
        attempts: u32,
        message: &str,
    ) -> TaskStatusWrite {
        let mut entry = StepWrite::bare(step, phase, attempts);
        entry.message = Some(message.to_string());
        TaskStatusWrite::step(entry)
    }

    /// This write with the task's block `reason` (kept when a recovery is ignored).
    pub fn with_reason(mut self, reason: Option<BlockReason>) -> TaskStatusWrite {
        self.reason = reason;
        self
    }

    /// This write recording that the recovery of `generation` was acted on (nothing when
    /// `None`: an automatic retry, or a note).
    pub fn with_recovery_generation(mut self, generation: Option<i64>) -> TaskStatusWrite {
        self.recovery_generation = generation;
        self
    }

    /// This write carrying the node-facts reports `facts` (an object with `before` and/or
    /// `after`; nothing when `None` or empty). A manager that wrote a report writes it again
    /// in each later write of its own, or the apply removes it.
    pub fn with_facts(mut self, facts: Option<serde_json::Value>) -> TaskStatusWrite {
        self.node_facts = facts.filter(|f| f.as_object().is_some_and(|o| !o.is_empty()));
        self
    }
}

/// The field manager of step `step`'s entry for a writer whose manager is `manager`.
pub fn step_manager(manager: &str, step: &str) -> String {
    format!("{manager}.step.{step}")
}

/// Server-side apply of `status` (a [`TaskStatusWrite`], or another part of the status) to
/// NodeTask `name` under field manager `manager`.
pub async fn apply(
    client: &Client,
    name: &str,
    manager: &str,
    status: &impl Serialize,
) -> Result<()> {
    let api: Api<NodeTask> = Api::all(client.clone());
    let patch = json!({ "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeTask", "metadata": { "name": name }, "status": status });
    api.patch_status(
        name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(Error::kube(format!(
        "writing the status of NodeTask {name}"
    )))?;
    Ok(())
}

/// Removes NodeTask `name`'s block `reason`, whichever field manager set it (a retry's
/// write: the reason no longer applies). A JSON merge patch, not an apply: an apply can only
/// drop fields its own manager owns, and the reason may be the agent's.
pub async fn clear_reason(client: &Client, name: &str) -> Result<()> {
    let api: Api<NodeTask> = Api::all(client.clone());
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": { "reason": null } })),
    )
    .await
    .map_err(Error::kube(format!(
        "removing the block reason of NodeTask {name}"
    )))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use bosun_api::node_task::CheckStatus;
    use serde_json::json;

    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn json_of(write: &TaskStatusWrite) -> serde_json::Value {
        serde_json::to_value(write).unwrap()
    }

    #[test]
    fn a_started_step_writes_its_attempt_and_start_time_with_microseconds() {
        let w = TaskStatusWrite::step_started(
            "greet",
            StepPhase::Running,
            2,
            t("2026-01-02T03:04:05.1234567Z"),
        );
        assert_eq!(
            json_of(&w),
            json!({
                "currentStep": "greet",
                "message": "running step greet",
                "steps": [{ "name": "greet", "phase": "Running", "attempts": 2, "startedAt": "2026-01-02T03:04:05.123456Z" }],
            })
        );
    }

    #[test]
    fn a_step_in_progress_writes_its_message_and_no_finish() {
        let w =
            TaskStatusWrite::step_progress("drain", 1, t("2026-01-02T03:04:05Z"), "2 pods left");
        assert_eq!(
            json_of(&w),
            json!({
                "currentStep": "drain",
                "steps": [{ "name": "drain", "phase": "Running", "attempts": 1, "startedAt": "2026-01-02T03:04:05.000000Z", "message": "2 pods left" }],
            })
        );
    }

    #[test]
    fn a_controller_step_that_failed_writes_its_error_and_no_plugin_fields() {
        let entry = StepWrite::finished(
            "drain",
            1,
            t("2026-01-02T03:04:05Z"),
            t("2026-01-02T03:04:06Z"),
            StepEnd {
                phase: StepPhase::Failed,
                changed: false,
                message: "timed out".into(),
                error: Some(StepError {
                    code: "drain-timeout".into(),
                    message: "timed out".into(),
                    retryable: true,
                }),
            },
            None,
        );
        assert_eq!(
            json_of(&TaskStatusWrite::step(entry.clone())),
            json!({
                "currentStep": "drain",
                "steps": [{ "name": "drain", "phase": "Failed", "attempts": 1,
                    "startedAt": "2026-01-02T03:04:05.000000Z", "finishedAt": "2026-01-02T03:04:06.000000Z",
                    "changed": false, "message": "timed out",
                    "error": { "code": "drain-timeout", "message": "timed out", "retryable": true } }],
            })
        );
        let read = entry.to_status();
        assert_eq!(read.started_at.unwrap().0, t("2026-01-02T03:04:05Z"));
        assert_eq!(read.error.unwrap().code, "drain-timeout");
        assert_eq!(
            json_of(&TaskStatusWrite::blocked(
                NodeTaskPhase::Blocked,
                1,
                BlockReason::StepFailed,
                "step drain: timed out"
            )),
            json!({ "phase": "Blocked", "attempts": 1, "reason": "StepFailed", "message": "step drain: timed out" })
        );
    }

    #[test]
    fn an_agent_step_that_succeeded_writes_every_report_field_even_when_empty() {
        let entry = StepWrite::finished(
            "greet",
            1,
            t("2026-01-02T03:04:05Z"),
            t("2026-01-02T03:04:06Z"),
            StepEnd {
                phase: StepPhase::Succeeded,
                changed: true,
                message: "said hello".into(),
                error: None,
            },
            Some(StepReport {
                preflight: vec![PreflightCheck {
                    name: "disk".into(),
                    status: CheckStatus::Pass,
                    message: String::new(),
                }],
                ..StepReport::default()
            }),
        );
        assert_eq!(
            json_of(&TaskStatusWrite::step_finished(entry, None)),
            json!({
                "currentStep": "greet",
                "message": "step greet succeeded: said hello",
                "steps": [{ "name": "greet", "phase": "Succeeded", "attempts": 1,
                    "startedAt": "2026-01-02T03:04:05.000000Z", "finishedAt": "2026-01-02T03:04:06.000000Z",
                    "changed": true, "message": "said hello",
                    "outputs": {}, "logTail": [], "preflight": [{ "name": "disk", "status": "Pass", "message": "" }],
                    "hostMilliseconds": 0 }],
            })
        );
    }

    #[test]
    fn an_agent_step_that_failed_blocks_the_task_with_its_reason() {
        let entry = StepWrite::finished(
            "greet",
            3,
            t("2026-01-02T03:04:05Z"),
            t("2026-01-02T03:04:06Z"),
            StepEnd {
                phase: StepPhase::Failed,
                changed: false,
                message: "no".into(),
                error: Some(StepError {
                    code: "denied".into(),
                    message: "no".into(),
                    retryable: false,
                }),
            },
            Some(StepReport {
                outputs: [("k".to_string(), "v".to_string())].into(),
                log_tail: vec!["line".into()],
                preflight: vec![],
                policy: Some(PolicyDecision {
                    allowed: false,
                    ..PolicyDecision::default()
                }),
                host_milliseconds: 1250,
            }),
        );
        assert_eq!(
            json_of(&TaskStatusWrite::step_finished(
                entry,
                Some((NodeTaskPhase::Blocked, BlockReason::PolicyDenied))
            )),
            json!({
                "currentStep": "greet",
                "phase": "Blocked",
                "reason": "PolicyDenied",
                "message": "step greet failed: no",
                "steps": [{ "name": "greet", "phase": "Failed", "attempts": 3,
                    "startedAt": "2026-01-02T03:04:05.000000Z", "finishedAt": "2026-01-02T03:04:06.000000Z",
                    "changed": false, "message": "no",
                    "outputs": { "k": "v" }, "logTail": ["line"], "preflight": [],
                    "policy": { "allowed": false },
                    "error": { "code": "denied", "message": "no", "retryable": false },
                    "hostMilliseconds": 1250 }],
            })
        );
    }

    #[test]
    fn an_interrupted_idempotent_step_keeps_its_attempt_and_start_and_runs_again() {
        let w = TaskStatusWrite::step_interrupted(
            "greet",
            StepPhase::Pending,
            2,
            Some(t("2026-01-02T03:04:05Z")),
            None,
        );
        assert_eq!(
            json_of(&w),
            json!({ "steps": [{ "name": "greet", "phase": "Pending", "attempts": 2, "startedAt": "2026-01-02T03:04:05.000000Z" }] })
        );
        // No start time known: none written.
        let w = TaskStatusWrite::step_interrupted("greet", StepPhase::Pending, 1, None, None);
        assert_eq!(
            json_of(&w),
            json!({ "steps": [{ "name": "greet", "phase": "Pending", "attempts": 1 }] })
        );
    }

    #[test]
    fn an_interrupted_step_that_is_not_idempotent_blocks_the_task_as_interrupted() {
        let w = TaskStatusWrite::step_interrupted(
            "upgrade",
            StepPhase::Failed,
            1,
            Some(t("2026-01-02T03:04:05Z")),
            Some((NodeTaskPhase::Blocked, t("2026-01-02T03:05:00Z"))),
        );
        assert_eq!(
            json_of(&w),
            json!({
                "phase": "Blocked",
                "reason": "Interrupted",
                "message": "step upgrade was interrupted by an agent restart and its action is not idempotent: check the node, then retry or skip",
                "steps": [{ "name": "upgrade", "phase": "Failed", "attempts": 1,
                    "startedAt": "2026-01-02T03:04:05.000000Z", "finishedAt": "2026-01-02T03:05:00.000000Z",
                    "message": "interrupted by an agent restart" }],
            })
        );
    }

    #[test]
    fn a_step_write_carries_the_node_facts_reports_given_and_nothing_for_none() {
        let w = TaskStatusWrite::step_started(
            "greet",
            StepPhase::Running,
            1,
            t("2026-01-02T03:04:05Z"),
        );
        let before =
            json!({ "collectedAt": "2026-01-02T03:04:04.500000Z", "kubeletVersion": "v1.34.4" });
        let carried = w.clone().with_facts(Some(json!({ "before": before })));
        assert_eq!(json_of(&carried)["nodeFacts"], json!({ "before": before }));
        assert_eq!(json_of(&w.clone().with_facts(None)), json_of(&w));
        assert_eq!(json_of(&w.clone().with_facts(Some(json!({})))), json_of(&w));
    }

    /// The controller's recovery writes (`bosun_controller::recovery`): the resumed step's
    /// entry under its manager, then the task's own fields, with the acted-on generation for a
    /// person's recovery and the kept reason for an ignored one.
    #[test]
    fn recovery_writes_a_resumed_step_then_the_task() {
        let step = TaskStatusWrite::step_resumed("upgrade", StepPhase::Pending, 2, "retry 1 of 3");
        assert_eq!(
            json_of(&step),
            json!({
                "currentStep": "upgrade",
                "steps": [{ "name": "upgrade", "phase": "Pending", "attempts": 2, "message": "retry 1 of 3" }],
            })
        );
        let top = TaskStatusWrite::task(NodeTaskPhase::Running, 2, Some("retried".into()))
            .with_recovery_generation(Some(7));
        assert_eq!(
            json_of(&top),
            json!({ "phase": "Running", "attempts": 2, "message": "retried", "recoveryGeneration": 7 })
        );
        let ignored = TaskStatusWrite::task(NodeTaskPhase::Blocked, 1, Some("ignored".into()))
            .with_reason(Some(BlockReason::StepFailed))
            .with_recovery_generation(Some(3));
        assert_eq!(
            json_of(&ignored),
            json!({ "phase": "Blocked", "attempts": 1, "reason": "StepFailed", "message": "ignored", "recoveryGeneration": 3 })
        );
        // A note: no generation, no reason, nothing else.
        assert_eq!(
            json_of(&TaskStatusWrite::task(
                NodeTaskPhase::Blocked,
                1,
                Some("n".into())
            )),
            json!({ "phase": "Blocked", "attempts": 1, "message": "n" })
        );
    }

    #[test]
    fn step_entries_have_a_manager_of_their_own() {
        assert_eq!(
            step_manager("bosun-agent", "greet"),
            "bosun-agent.step.greet"
        );
    }
}
