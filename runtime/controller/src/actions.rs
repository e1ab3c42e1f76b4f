//! Controller-side steps: `cordon`, `drain`, `uncordon`, `waitNodeReady`, `waitApiServer`.
//!
//! Each call is one non-blocking pass ([`run_step`]): it does what can be done now and says
//! whether the step succeeded, failed (with the reason the task blocks with) or is still in
//! progress (look again later). The step's `startedAt` in status is the clock for the
//! step's deadline, so a controller that restarts mid-drain keeps the same deadline.
//! Deadlines: `drain.timeoutSeconds` for a drain, `healthGates.timeoutSeconds` for the waits.

use std::time::Duration;

use bosun_api::node_task::BlockReason;
use bosun_api::operation::{OperationSpec, Step};
use bosun_planner::plan::controller_actions;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::drain::{self, Left, Pass};
use crate::health;

/// How often a drain that is waiting for pods looks again.
pub const DRAIN_RECHECK: Duration = Duration::from_secs(2);

/// What one pass of a controller step came to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepOutcome {
    /// Done. `changed` is false when there was nothing to do (a node already cordoned).
    Succeeded { message: String, changed: bool },
    /// Not done yet; the message says what it waits for (stable between passes that see
    /// the same thing, so an unchanged wait writes nothing).
    InProgress { message: String, recheck: Duration },
    /// Gave up: the task blocks with `reason`; `code` is the step error's stable code.
    Failed {
        reason: BlockReason,
        code: &'static str,
        message: String,
        retryable: bool,
    },
}

impl StepOutcome {
    fn failed(reason: BlockReason, code: &'static str, message: String) -> Self {
        StepOutcome::Failed {
            reason,
            code,
            message,
            retryable: true,
        }
    }
}

/// What a successful drain did, for the step's message and the `Drained` Event.
pub fn drained_message(node: &str, evicted: &[String], left: &[(String, Left)]) -> String {
    let mut m = format!("node {node} drained");
    if !evicted.is_empty() {
        m.push_str(&format!("; evicted {}", evicted.join(", ")));
    }
    let kept: Vec<String> = left
        .iter()
        .map(|(k, why)| match why {
            Left::DaemonSet => format!("{k} (DaemonSet)"),
            Left::Mirror => format!("{k} (static pod)"),
        })
        .collect();
    if !kept.is_empty() {
        m.push_str(&format!("; left {}", kept.join(", ")));
    }
    m
}

/// Decides a waiting step's fate from how long it has waited. Pure.
pub fn keep_waiting_or_fail(
    started: Timestamp,
    now: Timestamp,
    timeout_seconds: u32,
    fail: impl FnOnce() -> StepOutcome,
    wait: impl FnOnce(Timestamp) -> StepOutcome,
) -> StepOutcome {
    let deadline = started + Duration::from_secs(u64::from(timeout_seconds));
    if now >= deadline {
        fail()
    } else {
        wait(deadline)
    }
}

/// Runs one pass of the controller step `step` on `node`. `started` is when the step first
/// started (from its status), `now` the time of this pass.
pub async fn run_step(
    client: &Client,
    events: &crate::events::Events,
    op: &OperationSpec,
    task: &bosun_api::node_task::NodeTask,
    step: &Step,
    started: Timestamp,
) -> StepOutcome {
    let node = task.spec.node_name.as_str();
    let now = Timestamp::now();
    let step_failed =
        |m: String| StepOutcome::failed(BlockReason::StepFailed, "controller-step-failed", m);
    match step.action.as_str() {
        controller_actions::CORDON | controller_actions::UNCORDON => {
            let cordon = step.action == controller_actions::CORDON;
            let verb = if cordon { "cordoned" } else { "uncordoned" };
            match set_unschedulable(client, node, cordon, &task.name_any()).await {
                Ok(change) => StepOutcome::Succeeded {
                    message: match change {
                        Cordon::Patched => format!("node {node} {verb}"),
                        Cordon::DoneByThisTask => format!(
                            "node {node} {verb} (by this task before the controller restarted; recorded now)"
                        ),
                        Cordon::AlreadySo => format!("node {node} was already {verb}"),
                    },
                    changed: change != Cordon::AlreadySo,
                },
                Err(m) => step_failed(m),
            }
        }
        controller_actions::DRAIN => {
            let timeout = op.drain.timeout_seconds;
            match drain::pass(client, node, &task.name_any(), &op.drain).await {
                Ok(Pass::Drained { evicted, left }) => {
                    let message = drained_message(node, &evicted, &left);
                    events
                        .publish(
                            task,
                            bosun_cluster::events::Notice {
                                warning: false,
                                reason: crate::events::reasons::DRAINED,
                                action: "Drain",
                                note: message.clone(),
                            },
                        )
                        .await;
                    StepOutcome::Succeeded {
                        message,
                        changed: true,
                    }
                }
                Ok(Pass::Refused(message)) => StepOutcome::Failed {
                    reason: BlockReason::StepFailed,
                    code: "drain-refused",
                    message,
                    retryable: false,
                },
                Ok(Pass::Waiting { leftovers, .. }) => {
                    let what = drain::explain_leftovers(&leftovers);
                    keep_waiting_or_fail(
                        started,
                        now,
                        timeout,
                        || {
                            StepOutcome::failed(
                                BlockReason::DrainTimedOut,
                                "drain-timeout",
                                format!(
                                    "drain of node {node} did not finish within {timeout}s; still on the node: {what}. Let the budgets allow it (scale up, or change the PodDisruptionBudget) or move the pods, then recovery: Retry; or Skip this node (it stays cordoned)"
                                ),
                            )
                        },
                        |deadline| StepOutcome::InProgress {
                            message: format!(
                                "draining node {node} until {deadline}: waiting for {what}"
                            ),
                            recheck: DRAIN_RECHECK,
                        },
                    )
                }
                Err(error) => keep_waiting_or_fail(
                    started,
                    now,
                    timeout,
                    || {
                        StepOutcome::failed(
                            BlockReason::DrainTimedOut,
                            "drain-timeout",
                            format!(
                                "drain of node {node} did not finish within {timeout}s; last error: {error}"
                            ),
                        )
                    },
                    |deadline| StepOutcome::InProgress {
                        message: format!("draining node {node} until {deadline}: {error}"),
                        recheck: DRAIN_RECHECK,
                    },
                ),
            }
        }
        controller_actions::WAIT_NODE_READY | controller_actions::WAIT_API_SERVER => {
            let check = if step.action == controller_actions::WAIT_NODE_READY {
                health::node_ready(client, node).await
            } else {
                health::api_server_ready(client).await
            };
            let timeout = op.health_gates.timeout_seconds;
            match check {
                Ok(()) => StepOutcome::Succeeded {
                    message: if step.action == controller_actions::WAIT_NODE_READY {
                        format!("node {node} is Ready")
                    } else {
                        "the API server is ready (/readyz ok)".to_string()
                    },
                    changed: false,
                },
                Err(why) => keep_waiting_or_fail(
                    started,
                    now,
                    timeout,
                    || {
                        StepOutcome::failed(
                            BlockReason::HealthGateFailed,
                            "wait-timeout",
                            format!(
                                "{} gave up after {timeout}s (healthGates.timeoutSeconds): {why}; fix the cause, then recovery: Retry",
                                step.action
                            ),
                        )
                    },
                    |deadline| StepOutcome::InProgress {
                        message: format!("waiting until {deadline}: {why}"),
                        recheck: health::RECHECK,
                    },
                ),
            }
        }
        other => step_failed(format!(
            "unknown controller action {other}: expected one of cordon, drain, uncordon, waitNodeReady, waitApiServer; use recovery: Skip"
        )),
    }
}

/// What [`set_unschedulable`] found and did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cordon {
    /// The node was patched now.
    Patched,
    /// The node already was so, and its `bosun.dev/cordon` annotation says this task made it
    /// so: a controller stopped between the patch and the step's status write.
    DoneByThisTask,
    /// The node already was so, by someone else's doing: nothing changed.
    AlreadySo,
}

/// The annotation value recording that `task` set the node's `spec.unschedulable` to `value`.
fn cordon_mark(task: &str, value: bool) -> String {
    format!("{task} {}", if value { "cordoned" } else { "uncordoned" })
}

/// Whether the node must be patched: `current` is its `spec.unschedulable`, `mark` its
/// `bosun.dev/cordon` annotation.
fn cordon_decision(current: bool, mark: Option<&str>, value: bool, task: &str) -> Option<Cordon> {
    if current != value {
        return None;
    }
    Some(if mark == Some(cordon_mark(task, value).as_str()) {
        Cordon::DoneByThisTask
    } else {
        Cordon::AlreadySo
    })
}

/// Sets the node's `spec.unschedulable` for the NodeTask `task`, patching only when it
/// differs; the same patch records the change in the node's `bosun.dev/cordon` annotation,
/// so a repeat after a controller restart is recognised without a second write.
pub async fn set_unschedulable(
    client: &Client,
    node: &str,
    value: bool,
    task: &str,
) -> Result<Cordon, String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let current = nodes
        .get_opt(node)
        .await
        .map_err(|e| format!("reading node {node}: {e}"))?;
    let Some(current) = current else {
        return Err(format!("node {node} does not exist"));
    };
    let unschedulable = current
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    let mark = current
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(bosun_api::labels::annotations::CORDON))
        .map(String::as_str);
    if let Some(found) = cordon_decision(unschedulable, mark, value, task) {
        return Ok(found);
    }
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": { "annotations": { bosun_api::labels::annotations::CORDON: cordon_mark(task, value) } },
                "spec": { "unschedulable": value },
            })),
        )
        .await
        .map_err(|e| format!("patching node {node} spec.unschedulable={value}: {e}"))?;
    Ok(Cordon::Patched)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cordon_this_task_made_before_a_restart_is_recognised_and_not_repeated() {
        // Not yet so: patch.
        assert_eq!(cordon_decision(false, None, true, "t1"), None);
        assert_eq!(
            cordon_decision(true, Some("t1 cordoned"), false, "t1"),
            None
        );
        // So by this task's own earlier patch (the controller stopped before the status).
        assert_eq!(
            cordon_decision(true, Some("t1 cordoned"), true, "t1"),
            Some(Cordon::DoneByThisTask)
        );
        assert_eq!(
            cordon_decision(false, Some("t1 uncordoned"), false, "t1"),
            Some(Cordon::DoneByThisTask)
        );
        // So by someone else: an admin's cordon, another task's, or the opposite mark.
        assert_eq!(
            cordon_decision(true, None, true, "t1"),
            Some(Cordon::AlreadySo)
        );
        assert_eq!(
            cordon_decision(true, Some("t0 cordoned"), true, "t1"),
            Some(Cordon::AlreadySo)
        );
        assert_eq!(
            cordon_decision(true, Some("t1 uncordoned"), true, "t1"),
            Some(Cordon::AlreadySo)
        );
        assert_eq!(
            cordon_decision(false, None, false, "t1"),
            Some(Cordon::AlreadySo)
        );
    }

    #[test]
    fn a_drain_message_says_what_went_and_what_stayed() {
        let m = drained_message(
            "n1",
            &["ns/a".into()],
            &[
                ("kube-system/ds-x".into(), Left::DaemonSet),
                ("kube-system/etcd-n1".into(), Left::Mirror),
            ],
        );
        assert_eq!(
            m,
            "node n1 drained; evicted ns/a; left kube-system/ds-x (DaemonSet), kube-system/etcd-n1 (static pod)"
        );
        assert_eq!(drained_message("n1", &[], &[]), "node n1 drained");
    }

    #[test]
    fn waiting_turns_into_failure_exactly_at_the_deadline() {
        let start = Timestamp::from_second(1_800_000_000).unwrap();
        let fail =
            || StepOutcome::failed(BlockReason::DrainTimedOut, "drain-timeout", "late".into());
        let wait = |d: Timestamp| StepOutcome::InProgress {
            message: d.to_string(),
            recheck: DRAIN_RECHECK,
        };
        let before = keep_waiting_or_fail(start, start + Duration::from_secs(599), 600, fail, wait);
        assert_eq!(
            before,
            StepOutcome::InProgress {
                message: (start + Duration::from_secs(600)).to_string(),
                recheck: DRAIN_RECHECK
            }
        );
        let at = keep_waiting_or_fail(start, start + Duration::from_secs(600), 600, fail, wait);
        assert!(matches!(
            at,
            StepOutcome::Failed {
                reason: BlockReason::DrainTimedOut,
                ..
            }
        ));
    }
}
