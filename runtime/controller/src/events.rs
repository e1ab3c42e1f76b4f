//! Kubernetes Events (events.k8s.io/v1) for Operations and NodeTasks.
//!
//! The controller reports what a person following `kubectl get events` wants to know and a
//! task's status does not say by itself: a task waits for approval, was blocked (with its
//! reason and message: a Warning), was retried or skipped by a recovery, became invalid, a
//! node was drained (the pods evicted); and the Operation's own phase changes. A task's
//! routine start and success are not Events: its status says them (phase, each step's start
//! and end), and the Operation's Events and status say how the rollout goes; at a thousand
//! nodes they were two writes per node that told nothing new. Operations and NodeTasks
//! are cluster-scoped, so their Events live in the `default` namespace (as for Nodes).
//!
//! Which event a change deserves is decided by pure functions ([`task_event`],
//! [`operation_event`]); [`Events`] remembers the last phase it saw of every task so that a
//! change made by anyone (the controller itself, an agent blocking a step, a person setting
//! `recovery`) is reported once. Guarantees: publishing never fails a reconcile (a refused
//! Event is logged); a controller that restarts does not repeat events for changes made
//! before it started (it may miss those made while it was down).

use std::collections::HashMap;
use std::sync::Mutex;

use bosun_api::node_task::{NodeTask, NodeTaskPhase};
use bosun_api::operation::{Operation, OperationPhase};
use bosun_cluster::events::{Notice, Publisher};
use kube::{Client, Resource, ResourceExt};

/// Event reasons, stable so people and tests can filter on them.
pub mod reasons {
    pub const STARTED: &str = "Started";
    pub const AWAITING_APPROVAL: &str = "AwaitingApproval";
    pub const RETRIED: &str = "Retried";
    pub const BLOCKED: &str = "Blocked";
    pub const SUCCEEDED: &str = "Succeeded";
    pub const SKIPPED: &str = "Skipped";
    pub const INVALID: &str = "Invalid";
    pub const DRAINED: &str = "Drained";
    pub const PAUSED: &str = "Paused";
    pub const RESUMED: &str = "Resumed";
    pub const FAILED: &str = "Failed";
}

/// The Events a NodeTask deserves when its phase moved from `from` to `to`, in order (at
/// most one: see [`task_event`]).
pub fn task_events(
    from: Option<NodeTaskPhase>,
    to: NodeTaskPhase,
    reason: Option<&str>,
    message: &str,
    node: &str,
) -> Vec<Notice> {
    task_event(from, to, reason, message, node)
        .into_iter()
        .collect()
}

/// The Event a NodeTask deserves when its phase moved from `from` to `to` (`from` is `None`
/// when this controller has not seen the task before: nothing is reported then, so a
/// restart does not repeat old news). `message` and `reason` are the task's status fields.
pub fn task_event(
    from: Option<NodeTaskPhase>,
    to: NodeTaskPhase,
    reason: Option<&str>,
    message: &str,
    node: &str,
) -> Option<Notice> {
    use NodeTaskPhase as P;
    let from = from?;
    if from == to {
        return None;
    }
    Some(match to {
        P::Pending => return None,
        P::AwaitingApproval => Notice::normal(
            reasons::AWAITING_APPROVAL,
            "Schedule",
            format!("node {node}: its turn came; waiting for approval (spec.approve: true)"),
        ),
        P::Running if from == P::Blocked => Notice::normal(
            reasons::RETRIED,
            "Recover",
            format!("node {node}: running again after recovery: Retry"),
        ),
        // A routine start or success: the task's status says it (see the module's doc).
        P::Running | P::Succeeded => return None,
        P::Blocked => {
            let why = reason.unwrap_or("Blocked");
            Notice::warning(
                reasons::BLOCKED,
                "RunStep",
                format!("node {node} blocked ({why}): {message}"),
            )
        }
        P::Skipped => Notice::normal(
            reasons::SKIPPED,
            "Recover",
            format!("node {node}: skipped by recovery: Skip; the node was left as it was"),
        ),
        P::Invalid => Notice::warning(
            reasons::INVALID,
            "Schedule",
            format!("node {node}: {message}"),
        ),
    })
}

/// The Event an Operation deserves when this reconcile moved it from `from` to `to`.
pub fn operation_event(from: OperationPhase, to: OperationPhase, message: &str) -> Option<Notice> {
    use OperationPhase as P;
    if from == to {
        return None;
    }
    Some(match to {
        P::Pending => return None,
        P::Running if from == P::Paused => {
            Notice::normal(reasons::RESUMED, "Resume", message.to_string())
        }
        P::Running if from == P::Pending => {
            Notice::normal(reasons::STARTED, "Plan", format!("plan frozen; {message}"))
        }
        // Back to Running after a block was resolved, or after an approval.
        P::Running => return None,
        P::Paused => Notice::normal(
            reasons::PAUSED,
            "Pause",
            "spec.paused is true: running steps finish, nothing new starts".to_string(),
        ),
        P::AwaitingApproval => {
            Notice::normal(reasons::AWAITING_APPROVAL, "Schedule", message.to_string())
        }
        P::Blocked => Notice::warning(reasons::BLOCKED, "RunStep", message.to_string()),
        P::Succeeded => Notice::normal(reasons::SUCCEEDED, "Finish", message.to_string()),
        P::Failed => Notice::warning(reasons::FAILED, "Finish", message.to_string()),
    })
}

/// Publishes Events and remembers the task phases it has seen. Cheap to share (`Arc`-backed
/// recorder, one lock held only for map updates).
pub struct Events {
    publisher: Publisher,
    seen: Mutex<HashMap<String, NodeTaskPhase>>,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    /// `instance` names this controller process (its leader-election identity), so Events
    /// say which replica acted. Reported as [`bosun_cluster::events::CONTROLLER`].
    pub fn new(client: Client, instance: String) -> Self {
        Events {
            publisher: Publisher::new(client, bosun_cluster::events::CONTROLLER, instance),
            seen: Mutex::default(),
        }
    }

    /// Publishes `notice` about `object`. Never fails: a refused Event is logged.
    pub async fn publish<K: Resource<DynamicType = ()>>(&self, object: &K, notice: Notice) {
        self.publisher.publish(object, &notice).await;
    }

    /// Reports every task whose phase changed since this controller last saw it, and the
    /// Operation's own phase change from `from` to `to`. Once the Operation is finished its
    /// tasks are forgotten (a finished Operation is not looked at again), so the memory is
    /// bounded by the Operations in flight.
    pub async fn observe<'a>(
        &self,
        op: &Operation,
        from: OperationPhase,
        to: OperationPhase,
        message: &str,
        tasks: impl IntoIterator<Item = &'a NodeTask>,
    ) {
        let mut notices = Vec::new();
        {
            let mut seen = self
                .seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for task in tasks {
                let Some(uid) = task.uid() else { continue };
                let status = task.status.clone().unwrap_or_default();
                let before = if to.is_finished() {
                    seen.remove(&uid)
                } else {
                    seen.insert(uid, status.phase)
                };
                let reason = status.reason.map(|r| format!("{r:?}"));
                let message = status.message.clone().unwrap_or_default();
                for n in task_events(
                    before,
                    status.phase,
                    reason.as_deref(),
                    &message,
                    &task.spec.node_name,
                ) {
                    notices.push((task.clone(), n));
                }
            }
        }
        for (task, notice) in notices {
            self.publish(&task, notice).await;
        }
        if let Some(notice) = operation_event(from, to, message) {
            self.publish(op, notice).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeTaskPhase as P;

    #[test]
    fn a_task_seen_for_the_first_time_reports_nothing() {
        assert_eq!(
            task_event(None, P::Blocked, Some("StepFailed"), "boom", "n1"),
            None
        );
        assert_eq!(
            task_event(Some(P::Running), P::Running, None, "", "n1"),
            None
        );
    }

    #[test]
    fn each_task_change_has_its_reason() {
        let retried = task_event(Some(P::Blocked), P::Running, None, "", "n1").unwrap();
        assert_eq!(retried.reason, reasons::RETRIED);
        let blocked = task_event(
            Some(P::Running),
            P::Blocked,
            Some("DrainTimedOut"),
            "pods ns/a held by PDB ns/p",
            "n1",
        )
        .unwrap();
        assert!(blocked.warning);
        assert_eq!(blocked.reason, reasons::BLOCKED);
        assert!(
            blocked.note.contains("DrainTimedOut")
                && blocked.note.contains("PDB ns/p")
                && blocked.note.contains("n1"),
            "{}",
            blocked.note
        );
        assert_eq!(
            task_event(Some(P::Blocked), P::Skipped, None, "", "n1")
                .unwrap()
                .reason,
            reasons::SKIPPED
        );
        assert_eq!(
            task_event(Some(P::Pending), P::AwaitingApproval, None, "", "n1")
                .unwrap()
                .reason,
            reasons::AWAITING_APPROVAL
        );
        assert!(
            task_event(Some(P::Pending), P::Invalid, None, "node gone", "n1")
                .unwrap()
                .warning
        );
    }

    #[test]
    fn a_routine_start_or_success_of_a_task_is_no_event() {
        let r = |v: Vec<Notice>| v.into_iter().map(|n| n.reason).collect::<Vec<_>>();
        for (from, to) in [
            (P::Pending, P::Running),
            (P::AwaitingApproval, P::Running),
            (P::Running, P::Succeeded),
            (P::Pending, P::Succeeded),
        ] {
            assert!(
                task_events(Some(from), to, None, "", "n1").is_empty(),
                "{from:?} -> {to:?}"
            );
        }
        // A task seen waiting, then blocked: the block only.
        assert_eq!(
            r(task_events(
                Some(P::AwaitingApproval),
                P::Blocked,
                Some("StepFailed"),
                "x",
                "n1"
            )),
            [reasons::BLOCKED]
        );
        assert_eq!(
            r(task_events(Some(P::Blocked), P::Skipped, None, "", "n1")),
            [reasons::SKIPPED]
        );
        assert!(task_events(None, P::Blocked, Some("StepFailed"), "x", "n1").is_empty());
    }

    #[test]
    fn operation_changes_report_start_block_pause_and_finish_but_not_every_return_to_running() {
        use OperationPhase as O;
        assert_eq!(
            operation_event(O::Pending, O::Running, "planned 3 nodes")
                .unwrap()
                .reason,
            reasons::STARTED
        );
        assert_eq!(
            operation_event(O::Running, O::Blocked, "n1: boom")
                .unwrap()
                .note,
            "n1: boom"
        );
        assert!(
            operation_event(O::Running, O::Blocked, "x")
                .unwrap()
                .warning
        );
        assert_eq!(
            operation_event(O::Running, O::Paused, "").unwrap().reason,
            reasons::PAUSED
        );
        assert_eq!(
            operation_event(O::Paused, O::Running, "").unwrap().reason,
            reasons::RESUMED
        );
        assert_eq!(operation_event(O::Blocked, O::Running, ""), None);
        assert_eq!(
            operation_event(O::Running, O::Succeeded, "4/4")
                .unwrap()
                .reason,
            reasons::SUCCEEDED
        );
        assert!(
            operation_event(O::Pending, O::Failed, "cannot plan")
                .unwrap()
                .warning
        );
        assert_eq!(operation_event(O::Running, O::Running, ""), None);
    }
}
