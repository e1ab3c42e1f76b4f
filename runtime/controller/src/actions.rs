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
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
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
        controller_actions::CORDON => match set_unschedulable(client, node, true).await {
            Ok(changed) => StepOutcome::Succeeded {
                message: format!("node {node} cordoned"),
                changed,
            },
            Err(m) => step_failed(m),
        },
        controller_actions::UNCORDON => match set_unschedulable(client, node, false).await {
            Ok(changed) => StepOutcome::Succeeded {
                message: format!("node {node} uncordoned"),
                changed,
            },
            Err(m) => step_failed(m),
        },
        controller_actions::DRAIN => {
            let timeout = op.drain.timeout_seconds;
            match drain::pass(client, node, &op.drain).await {
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

/// Sets the node's `spec.unschedulable`, patching only when it differs. `Ok(true)` when it
/// changed something.
pub async fn set_unschedulable(client: &Client, node: &str, value: bool) -> Result<bool, String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let current = nodes
        .get_opt(node)
        .await
        .map_err(|e| format!("reading node {node}: {e}"))?;
    let Some(current) = current else {
        return Err(format!("node {node} does not exist"));
    };
    if current
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
        == value
    {
        return Ok(false);
    }
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "unschedulable": value } })),
        )
        .await
        .map_err(|e| format!("patching node {node} spec.unschedulable={value}: {e}"))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

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
