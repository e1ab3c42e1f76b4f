//! Controller-side steps: `cordon`, `drain`, `uncordon`, `waitNodeReady`, `waitApiServer`.
//!
//! Each call is one non-blocking pass ([`run_step`]): it does what can be done now and says
//! whether the step succeeded, failed (with the reason the task blocks with) or is still in
//! progress (look again later). The step's `startedAt` in status is the clock for the
//! step's deadline, so a controller that restarts mid-drain keeps the same deadline.
//! Deadlines: `drain.timeoutSeconds` for a drain, `healthGates.timeoutSeconds` for the waits.
//!
//! A drain inside the window of the task's cordon (see [`bosun_cluster::cordon`]) checks
//! that the node is still cordoned instead of cordoning it: on a node someone else
//! uncordoned it fails at once as `CordonCleared` (not retryable) with a Warning Event of
//! that reason, evicting nothing.

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

/// How long a cordon or uncordon keeps trying again after transient API errors (see
/// [`is_transient`]) before its step fails. A busy API server answers a patch it could not
/// finish in time with `504`; at 1,000 nodes cordoned at once that failed five steps
/// (docs/benchmarks.md).
pub const CORDON_RETRY_FOR: Duration = Duration::from_secs(120);

/// The longest wait between two tries of a cordon or uncordon after a transient error.
pub const CORDON_RETRY_MAX: Duration = Duration::from_secs(15);

/// Whether an API error is worth trying again unchanged: the server was busy or failing
/// (`429`, `5xx`) or the request never got an answer (a connection reset, a timeout).
/// Everything else (a missing node, a forbidden write, an invalid patch) is not.
pub fn is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => true,
        _ => false,
    }
}

/// When a step that has tried since `started` tries again after a transient error: after as
/// long as it has already tried (a doubling backoff without a counter), at least a second
/// and at most [`CORDON_RETRY_MAX`].
fn retry_after(started: Timestamp, now: Timestamp) -> Duration {
    let tried = now
        .duration_since(started)
        .try_into()
        .unwrap_or(Duration::ZERO);
    tried.clamp(Duration::from_secs(1), CORDON_RETRY_MAX)
}

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
/// started (from its status), `now` the time of this pass. `known`: the task's Node as the
/// controller's watch shows it, if it does (see [`set_unschedulable`]).
pub async fn run_step(
    client: &Client,
    events: &crate::events::Events,
    op: &OperationSpec,
    task: &bosun_api::node_task::NodeTask,
    step: &Step,
    started: Timestamp,
    known: Option<&Node>,
) -> StepOutcome {
    let pass = StepPass {
        client,
        node: task.spec.node_name.as_str(),
        task,
        step,
        started,
        now: Timestamp::now(),
    };
    match step.action.as_str() {
        controller_actions::CORDON | controller_actions::UNCORDON => {
            cordon_step(&pass, known).await
        }
        controller_actions::DRAIN => drain_step(&pass, events, op).await,
        controller_actions::WAIT_NODE_READY | controller_actions::WAIT_API_SERVER => {
            wait_step(&pass, op).await
        }
        other => step_failed(format!(
            "unknown controller action {other}: expected one of cordon, drain, uncordon, waitNodeReady, waitApiServer; use recovery: Skip"
        )),
    }
}

/// One pass of one controller step: what every kind of step reads.
struct StepPass<'a> {
    client: &'a Client,
    /// The task's node.
    node: &'a str,
    task: &'a bosun_api::node_task::NodeTask,
    step: &'a Step,
    /// When the step first started (from its status).
    started: Timestamp,
    /// The time of this pass.
    now: Timestamp,
}

/// A controller step that failed for a reason of its own (not a timeout).
fn step_failed(message: String) -> StepOutcome {
    StepOutcome::failed(BlockReason::StepFailed, "controller-step-failed", message)
}

/// `cordon` and `uncordon`: the node's `spec.unschedulable` ([`set_unschedulable`]); a
/// transient API error is tried again for [`CORDON_RETRY_FOR`].
async fn cordon_step(pass: &StepPass<'_>, known: Option<&Node>) -> StepOutcome {
    let StepPass {
        client,
        node,
        task,
        step,
        started,
        now,
    } = *pass;
    let cordon = step.action == controller_actions::CORDON;
    let verb = if cordon { "cordoned" } else { "uncordoned" };
    let doing = if cordon { "cordoning" } else { "uncordoning" };
    match set_unschedulable(client, node, cordon, &task.name_any(), known).await {
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
        Err(CordonError {
            message,
            transient: true,
        }) => keep_waiting_or_fail(
            started,
            now,
            CORDON_RETRY_FOR.as_secs() as u32,
            || {
                step_failed(format!(
                    "{doing} node {node}: the API server kept failing for {}s; last error: {message}. Check the API server, then recovery: Retry",
                    CORDON_RETRY_FOR.as_secs()
                ))
            },
            |deadline| StepOutcome::InProgress {
                message: format!(
                    "{doing} node {node}: trying again until {deadline} after a transient error: {message}"
                ),
                recheck: retry_after(started, now),
            },
        ),
        Err(CordonError { message, .. }) => step_failed(message),
    }
}

/// `drain`: one pass of the drain ([`drain::pass`]), waiting up to `drain.timeoutSeconds`
/// for what is left on the node; inside the task's cordon window it checks the cordon
/// still holds.
async fn drain_step(
    pass: &StepPass<'_>,
    events: &crate::events::Events,
    op: &OperationSpec,
) -> StepOutcome {
    let StepPass {
        client,
        node,
        task,
        step,
        ..
    } = *pass;
    let timeout = op.drain.timeout_seconds;
    // Inside the window of the task's cordon, the drain checks the cordon holds
    // instead of making it (see `bosun_cluster::cordon`).
    let window = task
        .spec
        .steps
        .iter()
        .position(|s| s.name == step.name)
        .and_then(|index| bosun_cluster::cordon::cordon_window(task, index));
    match drain::pass(client, node, &task.name_any(), &op.drain, window.is_some()).await {
        Ok(Pass::Uncordoned) => {
            let message = bosun_cluster::cordon::message(
                &task.spec.operation,
                node,
                window.as_deref().unwrap_or_default(),
                &step.name,
                true,
            );
            events
                .publish(
                    task,
                    bosun_cluster::events::Notice::warning(
                        BlockReason::CordonCleared.as_str(),
                        "CheckCordon",
                        format!("step {}: {message}", step.name),
                    ),
                )
                .await;
            StepOutcome::Failed {
                reason: BlockReason::CordonCleared,
                code: bosun_cluster::cordon::CODE,
                message,
                retryable: false,
            }
        }
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
            drain_not_done(
                pass,
                timeout,
                &format!(
                    "still on the node: {what}. Let the budgets allow it (scale up, or change the PodDisruptionBudget) or move the pods, then recovery: Retry; or Skip this node (it stays cordoned)"
                ),
                &format!("waiting for {what}"),
            )
        }
        Err(error) => drain_not_done(
            pass,
            timeout,
            &format!("last error: {error}"),
            &error.to_string(),
        ),
    }
}

/// A drain not done in this pass: it goes on until `timeout` seconds after it started,
/// saying `waiting`, then fails (`DrainTimedOut`) saying `gave_up`.
fn drain_not_done(pass: &StepPass<'_>, timeout: u32, gave_up: &str, waiting: &str) -> StepOutcome {
    let node = pass.node;
    keep_waiting_or_fail(
        pass.started,
        pass.now,
        timeout,
        || {
            StepOutcome::failed(
                BlockReason::DrainTimedOut,
                "drain-timeout",
                format!("drain of node {node} did not finish within {timeout}s; {gave_up}"),
            )
        },
        |deadline| StepOutcome::InProgress {
            message: format!("draining node {node} until {deadline}: {waiting}"),
            recheck: DRAIN_RECHECK,
        },
    )
}

/// `waitNodeReady` and `waitApiServer`: the node's Ready, or this node's own control plane
/// back after a restart, waited for up to `healthGates.timeoutSeconds`.
async fn wait_step(pass: &StepPass<'_>, op: &OperationSpec) -> StepOutcome {
    let StepPass {
        client,
        node,
        task,
        step,
        started,
        now,
    } = *pass;
    let check = if step.action == controller_actions::WAIT_NODE_READY {
        health::node_ready(client, node).await
    } else {
        // The `/readyz` may come from another control plane: the API server this
        // task restarted is back when this node's own control-plane Pods are
        // (restarted and Ready), so the restart's time is the step's, not the gates'.
        let gates = bosun_api::operation::HealthGates {
            node_ready: false,
            api_server: true,
            control_plane_pods: true,
            ..Default::default()
        };
        health::check(client, &gates, task).await
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

/// The NodeTask whose cordon `node` is under, when it is cordoned and its `bosun.dev/cordon`
/// annotation says a Bosun task cordoned it (`<task> cordoned`). `None` for a schedulable
/// node and for a cordon Bosun did not record (a person's). A person who uncordons such a
/// node and cordons it again by hand leaves the annotation as it was, so that cordon too
/// reads as Bosun's (docs/operator.md, "Cordons").
pub fn cordoned_by(node: &Node) -> Option<String> {
    if !unschedulable_of(node) {
        return None;
    }
    let task = mark_of(node)?.strip_suffix(" cordoned")?;
    (!task.is_empty() && !task.contains(' ')).then(|| task.to_string())
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

/// Why [`set_unschedulable`] did not finish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CordonError {
    pub message: String,
    /// Trying again unchanged may work ([`is_transient`]).
    pub transient: bool,
}

impl CordonError {
    fn api(what: String) -> impl FnOnce(kube::Error) -> CordonError {
        move |e| CordonError {
            transient: is_transient(&e),
            message: format!("{what}: {e}"),
        }
    }
}

/// Sets the node's `spec.unschedulable` for the NodeTask `task`, patching only when it
/// differs; the same patch records the change in the node's `bosun.dev/cordon` annotation,
/// so a repeat after a controller restart is recognised without a second write (and so is
/// a patch that landed although its answer was lost, when the step tries again).
///
/// `known` is the Node as the controller's watch last showed it. When it shows that a patch
/// is due, the patch is sent at once with that `resourceVersion` as its precondition: no
/// read first. If the Node changed since (a 409 Conflict), or the watch shows nothing to do
/// (which a watch behind this controller's own last patch could show wrongly), the Node is
/// read from the API server and the decision made again on what it says. So a patch is
/// always decided on the Node as it is, and a cordon or uncordon in the usual order costs
/// one request instead of two.
pub async fn set_unschedulable(
    client: &Client,
    node: &str,
    value: bool,
    task: &str,
    known: Option<&Node>,
) -> Result<Cordon, CordonError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let patch_failed =
        || CordonError::api(format!("patching node {node} spec.unschedulable={value}"));
    if let Some(known) = known
        && let Some(version) = known.metadata.resource_version.as_deref()
        && cordon_decision(unschedulable_of(known), mark_of(known), value, task).is_none()
    {
        match patch_unschedulable(&nodes, node, value, task, Some(version)).await {
            Ok(()) => return Ok(Cordon::Patched),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tracing::debug!(%node, "the Node changed since the watch showed it; reading it");
            }
            Err(e) => return Err(patch_failed()(e)),
        }
    }
    let current = nodes
        .get_opt(node)
        .await
        .map_err(CordonError::api(format!("reading node {node}")))?;
    let Some(current) = current else {
        return Err(CordonError {
            message: format!("node {node} does not exist"),
            transient: false,
        });
    };
    if let Some(found) = cordon_decision(unschedulable_of(&current), mark_of(&current), value, task)
    {
        return Ok(found);
    }
    patch_unschedulable(&nodes, node, value, task, None)
        .await
        .map_err(patch_failed())?;
    Ok(Cordon::Patched)
}

/// The node's `spec.unschedulable` (false when unset).
fn unschedulable_of(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// The node's `bosun.dev/cordon` annotation.
fn mark_of(node: &Node) -> Option<&str> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(bosun_api::labels::annotations::CORDON))
        .map(String::as_str)
}

/// One merge patch: `spec.unschedulable` and this task's mark; with `precondition`, the API
/// server refuses it (409) unless the Node is still at that `resourceVersion`.
async fn patch_unschedulable(
    nodes: &Api<Node>,
    node: &str,
    value: bool,
    task: &str,
    precondition: Option<&str>,
) -> Result<(), kube::Error> {
    let mut metadata = json!({
        "annotations": { bosun_api::labels::annotations::CORDON: cordon_mark(task, value) }
    });
    if let Some(version) = precondition {
        metadata["resourceVersion"] = json!(version);
    }
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": metadata,
                "spec": { "unschedulable": value },
            })),
        )
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

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
    fn a_cordon_is_bosuns_only_while_the_node_is_cordoned_under_a_task_mark() {
        let node = |unschedulable: bool, mark: Option<&str>| -> Node {
            let mut annotations = serde_json::Map::new();
            if let Some(mark) = mark {
                annotations.insert(bosun_api::labels::annotations::CORDON.into(), json!(mark));
            }
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": { "name": "w1", "annotations": annotations },
                "spec": { "unschedulable": unschedulable },
            }))
            .unwrap()
        };
        assert_eq!(
            cordoned_by(&node(true, Some("up-w1 cordoned"))).as_deref(),
            Some("up-w1")
        );
        // A person's cordon: no mark, or the mark of an uncordon Bosun did.
        assert_eq!(cordoned_by(&node(true, None)), None);
        assert_eq!(cordoned_by(&node(true, Some("up-w1 uncordoned"))), None);
        // Not cordoned: nothing to undo, whatever the mark says.
        assert_eq!(cordoned_by(&node(false, Some("up-w1 cordoned"))), None);
        // A mark that is not one Bosun writes.
        assert_eq!(cordoned_by(&node(true, Some("cordoned"))), None);
        assert_eq!(cordoned_by(&node(true, Some(" cordoned"))), None);
        assert_eq!(cordoned_by(&node(true, Some("a b cordoned"))), None);
    }

    /// A fake API server with node w1 (schedulable) whose patches are answered with `code`.
    fn node_patch_answered(code: u16) -> (Client, Arc<Mutex<Vec<crate::fake_api::Seen>>>) {
        crate::fake_api::fake_answers(move |req| {
            if req.method == "PATCH" && code != 200 {
                let status = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "message": "the request failed", "reason": "Timeout", "code": code });
                return (code, status);
            }
            let node = json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": "w1" },
                "spec": { "unschedulable": false } });
            (200, node)
        })
    }

    async fn cordon_pass(client: &Client, started: Timestamp) -> StepOutcome {
        let task =
            bosun_api::node_task::NodeTask::new("op-w1", crate::fake_api::task_spec("op", "w1"));
        let step: Step = serde_json::from_value(
            json!({ "name": "cordon", "runsOn": "controller", "action": "cordon" }),
        )
        .unwrap();
        let op: OperationSpec = serde_json::from_value(json!({
            "custom": {"groups": [{"name": "all", "steps": [{"name": "greet", "plugin": "hello", "action": "greet"}]}]},
        }))
        .unwrap();
        let events = crate::events::Events::new(client.clone(), "test".into());
        run_step(client, &events, &op, &task, &step, started, None).await
    }

    /// A cordon whose patch the API server answers with a 504 (it could not finish in
    /// time) or a 429 tries again later, with a growing wait, until CORDON_RETRY_FOR has
    /// passed since the step started; then the step fails naming the last error. An error
    /// that will not go away by itself (403) fails the step at once.
    #[tokio::test]
    async fn a_cordon_tries_again_after_transient_errors_until_its_deadline() {
        for code in [504, 500, 429] {
            let (client, seen) = node_patch_answered(code);
            let now = Timestamp::now();
            match cordon_pass(&client, now).await {
                StepOutcome::InProgress { message, recheck } => {
                    assert!(
                        message.starts_with("cordoning node w1: trying again until")
                            && message.contains("transient error"),
                        "{message}"
                    );
                    assert_eq!(recheck, Duration::from_secs(1));
                }
                other => panic!("{code}: expected to try again, got {other:?}"),
            }
            let patches = seen
                .lock()
                .unwrap()
                .iter()
                .filter(|r| r.method == "PATCH")
                .count();
            assert_eq!(patches, 1, "{code}");
            // Later passes wait longer, up to CORDON_RETRY_MAX.
            let later = cordon_pass(&client, now - Duration::from_secs(6)).await;
            assert!(
                matches!(later, StepOutcome::InProgress { recheck, .. } if recheck >= Duration::from_secs(6)),
                "{later:?}"
            );
            let much_later = cordon_pass(&client, now - Duration::from_secs(100)).await;
            assert!(
                matches!(much_later, StepOutcome::InProgress { recheck, .. } if recheck == CORDON_RETRY_MAX),
                "{much_later:?}"
            );
            // Past the deadline: the step fails, with the last error.
            let failed = cordon_pass(&client, now - CORDON_RETRY_FOR).await;
            match failed {
                StepOutcome::Failed {
                    reason: BlockReason::StepFailed,
                    code: "controller-step-failed",
                    message,
                    retryable: true,
                } => assert!(
                    message.contains("kept failing for 120s")
                        && message.contains(&format!("{code}"))
                        && message.contains("recovery: Retry"),
                    "{message}"
                ),
                other => panic!("{code}: expected a failure, got {other:?}"),
            }
        }
        let (client, _) = node_patch_answered(403);
        let failed = cordon_pass(&client, Timestamp::now()).await;
        assert!(
            matches!(&failed, StepOutcome::Failed { reason: BlockReason::StepFailed, message, .. } if message.contains("patching node w1 spec.unschedulable=true")),
            "{failed:?}"
        );
        let (client, _) = node_patch_answered(200);
        assert_eq!(
            cordon_pass(&client, Timestamp::now()).await,
            StepOutcome::Succeeded {
                message: "node w1 cordoned".into(),
                changed: true
            }
        );
    }

    /// A drain pass of a task whose steps are cordon, drain, uncordon, with the cordon
    /// `cordon` phase, against a fake API server whose Node w1 is `unschedulable` and has
    /// no pods.
    async fn drain_pass_after_cordon(
        cordon: bosun_api::node_task::StepPhase,
        unschedulable: bool,
    ) -> (StepOutcome, Vec<crate::fake_api::Seen>) {
        let (client, seen) = crate::fake_api::fake_answers(move |req| {
            if req.path.ends_with("/pods") {
                return (
                    200,
                    json!({ "apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [] }),
                );
            }
            if req.path.ends_with("/events") {
                return (201, req.body.clone());
            }
            (
                200,
                serde_json::to_value(node_at("7", unschedulable, None)).unwrap(),
            )
        });
        let mut task =
            bosun_api::node_task::NodeTask::new("op-w1", crate::fake_api::task_spec("op", "w1"));
        task.spec.steps = serde_json::from_value(json!([
            { "name": "cordon", "runsOn": "controller", "action": "cordon" },
            { "name": "drain", "runsOn": "controller", "action": "drain" },
            { "name": "uncordon", "runsOn": "controller", "action": "uncordon" },
        ]))
        .unwrap();
        task.status = Some(bosun_api::node_task::NodeTaskStatus {
            steps: vec![bosun_api::node_task::StepStatus {
                name: "cordon".into(),
                phase: cordon,
                attempts: 1,
                ..Default::default()
            }],
            ..Default::default()
        });
        let op: OperationSpec = serde_json::from_value(json!({
            "custom": {"groups": [{"name": "all", "steps": [{"name": "greet", "plugin": "hello", "action": "greet"}]}]},
        }))
        .unwrap();
        let events = crate::events::Events::new(client.clone(), "test".into());
        let step = task.spec.steps[1].clone();
        let outcome = run_step(&client, &events, &op, &task, &step, Timestamp::now(), None).await;
        let seen = seen.lock().unwrap().clone();
        (outcome, seen)
    }

    /// A drain after the task's cordon, on a node someone else uncordoned since: the step
    /// fails as CordonCleared (not retryable), the node is not cordoned again, no pod is
    /// listed or evicted, and a Warning Event `CordonCleared` is published.
    #[tokio::test]
    async fn a_drain_inside_the_cordon_window_does_not_run_on_an_uncordoned_node() {
        let (outcome, seen) =
            drain_pass_after_cordon(bosun_api::node_task::StepPhase::Succeeded, false).await;
        match outcome {
            StepOutcome::Failed {
                reason: BlockReason::CordonCleared,
                code: "cordon-cleared",
                message,
                retryable: false,
            } => assert!(
                message.starts_with("node w1 is schedulable again: step `cordon` cordoned it")
                    && message.contains("Bosun does not start `drain` on a schedulable node")
                    && message.contains("kubectl cordon w1"),
                "{message}"
            ),
            other => panic!("expected CordonCleared, got {other:?}"),
        }
        let requests: Vec<(&str, &str)> = seen
            .iter()
            .map(|r| (r.method.as_str(), r.path.as_str()))
            .collect();
        assert!(
            !requests
                .iter()
                .any(|(m, p)| *m == "PATCH" || p.ends_with("/pods") || p.ends_with("/eviction")),
            "no cordon, no pod list, no eviction: {requests:?}"
        );
        let event = seen
            .iter()
            .find(|r| r.method == "POST" && r.path.ends_with("/events"))
            .expect("a CordonCleared Event");
        assert_eq!(event.body["reason"], "CordonCleared");
        assert_eq!(event.body["type"], "Warning");

        // The node still cordoned: the drain goes on (here: nothing to evict) without
        // cordoning it again.
        let (outcome, seen) =
            drain_pass_after_cordon(bosun_api::node_task::StepPhase::Succeeded, true).await;
        assert!(
            matches!(outcome, StepOutcome::Succeeded { .. }),
            "{outcome:?}"
        );
        assert!(seen.iter().all(|r| r.method != "PATCH"), "{seen:?}");

        // The cordon step skipped by a person: no window; the drain cordons the node
        // itself, as a drain without a cordon step does.
        let (outcome, seen) =
            drain_pass_after_cordon(bosun_api::node_task::StepPhase::Skipped, false).await;
        assert!(
            matches!(outcome, StepOutcome::Succeeded { .. }),
            "{outcome:?}"
        );
        assert!(
            seen.iter()
                .any(|r| r.method == "PATCH" && r.body["spec"]["unschedulable"] == true),
            "{seen:?}"
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

    /// A Node as the controller's watch would show it: `unschedulable`, the cordon mark
    /// `mark`, at resourceVersion `version`.
    fn node_at(version: &str, unschedulable: bool, mark: Option<&str>) -> Node {
        let mut annotations = serde_json::Map::new();
        if let Some(m) = mark {
            annotations.insert(bosun_api::labels::annotations::CORDON.into(), json!(m));
        }
        serde_json::from_value(json!({ "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": "w1", "resourceVersion": version, "annotations": annotations },
            "spec": { "unschedulable": unschedulable } }))
        .unwrap()
    }

    /// The watch shows the node schedulable: the cordon is one PATCH, carrying the watched
    /// resourceVersion as its precondition, and no read.
    #[tokio::test]
    async fn a_cordon_the_watch_shows_due_is_one_patch_with_the_watched_version() {
        let (client, seen) = crate::fake_api::fake_answers(|_| {
            (
                200,
                serde_json::to_value(node_at("8", true, Some("op-w1 cordoned"))).unwrap(),
            )
        });
        let known = node_at("7", false, None);
        let done = set_unschedulable(&client, "w1", true, "op-w1", Some(&known)).await;
        assert_eq!(done, Ok(Cordon::Patched));
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].method, "PATCH");
        assert_eq!(seen[0].body["metadata"]["resourceVersion"], "7");
        assert_eq!(seen[0].body["spec"]["unschedulable"], true);
        assert_eq!(
            seen[0].body["metadata"]["annotations"][bosun_api::labels::annotations::CORDON],
            "op-w1 cordoned"
        );
    }

    /// The Node changed after the watch showed it (here: this task's own earlier patch
    /// landed, its answer lost): the precondition fails with 409, the Node is read, and the
    /// step is recognised as done without a second patch.
    #[tokio::test]
    async fn a_cordon_refused_by_its_precondition_is_decided_again_on_the_node_read() {
        let (client, seen) = crate::fake_api::fake_answers(|req| {
            if req.method == "PATCH" {
                let status = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "message": "the object has been modified", "reason": "Conflict", "code": 409 });
                return (409, status);
            }
            (
                200,
                serde_json::to_value(node_at("9", true, Some("op-w1 cordoned"))).unwrap(),
            )
        });
        let stale = node_at("7", false, None);
        let done = set_unschedulable(&client, "w1", true, "op-w1", Some(&stale)).await;
        assert_eq!(done, Ok(Cordon::DoneByThisTask));
        let methods: Vec<String> = seen
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.method.clone())
            .collect();
        assert_eq!(methods, ["PATCH", "GET"]);
    }

    /// The watch shows nothing to do (a watch behind this controller's own last patch
    /// could): that is never trusted alone. The Node is read, and here it is still
    /// cordoned by this task's cordon, so the uncordon patches it (without a precondition,
    /// on the Node as read).
    #[tokio::test]
    async fn an_uncordon_the_watch_shows_already_done_is_checked_with_a_read() {
        let (client, seen) = crate::fake_api::fake_answers(|req| {
            if req.method == "PATCH" {
                return (
                    200,
                    serde_json::to_value(node_at("10", false, Some("op-w1 uncordoned"))).unwrap(),
                );
            }
            (
                200,
                serde_json::to_value(node_at("9", true, Some("op-w1 cordoned"))).unwrap(),
            )
        });
        // A watch that has not yet shown the cordon.
        let behind = node_at("5", false, None);
        let done = set_unschedulable(&client, "w1", false, "op-w1", Some(&behind)).await;
        assert_eq!(done, Ok(Cordon::Patched));
        let seen = seen.lock().unwrap();
        let methods: Vec<&str> = seen.iter().map(|r| r.method.as_str()).collect();
        assert_eq!(methods, ["GET", "PATCH"]);
        assert!(
            seen[1].body["metadata"].get("resourceVersion").is_none(),
            "{:?}",
            seen[1].body
        );
        assert_eq!(seen[1].body["spec"]["unschedulable"], false);
    }
}
