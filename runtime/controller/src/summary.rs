//! The Operation's status summary: phase, counts, message and conditions, from what the
//! scheduler decided and what the tasks say. Pure: no API call, no clock, no log, so every
//! reason and message is tested here without a cluster.
//!
//! Condition reasons are fixed strings (the phase and block reason names as written in
//! status, or the constants below), never `Debug` output.

use bosun_api::node_task::{BlockReason, NodeTaskPhase};
use bosun_api::operation::{OperationPhase, OperationStatus};
use bosun_planner::schedule::Schedule;
use bosun_planner::state::operation_transition;
use k8s_openapi::jiff::Timestamp;

use crate::time::set_condition;

/// Condition type on a Succeeded Operation: True (reason [`REASON_NOTHING_DONE`]) when no
/// NodeTask succeeded (each was skipped or invalid), False (reason [`REASON_WORK_DONE`])
/// otherwise. Absent until the Operation has succeeded.
pub const NOTHING_DONE: &str = "NothingDone";
/// [`NOTHING_DONE`] is True.
pub const REASON_NOTHING_DONE: &str = "AllNodesSkipped";
/// [`NOTHING_DONE`] is False.
pub const REASON_WORK_DONE: &str = "NodesSucceeded";

/// Condition type on an Operation while part of its spec is set aside: True (reason
/// [`REASON_UNREADABLE`]) while `rollout.maxUnavailable` cannot be read after the plan was
/// frozen, False (reason [`REASON_READ`]) once it can again; absent if it never happened.
pub const SPEC_IGNORED: &str = "SpecIgnored";
/// [`SPEC_IGNORED`] is True: `rollout.maxUnavailable` cannot be read.
pub const REASON_UNREADABLE: &str = "MaxUnavailableUnreadable";
/// [`SPEC_IGNORED`] is False: the spec reads again.
pub const REASON_READ: &str = "SpecRead";

/// The `Blocked` condition's reason while no task is blocked.
pub const REASON_NOT_BLOCKED: &str = "NotBlocked";

/// What the summary is made from, besides the status it updates.
#[derive(Debug)]
pub struct Summary<'a> {
    /// The phase stored before this reconcile.
    pub stored_phase: OperationPhase,
    /// What the scheduler decided in this reconcile.
    pub schedule: &'a Schedule,
    /// The Operation's tasks by node, as they are after this reconcile's writes.
    pub tasks: &'a crate::reconcile::Tasks,
    /// One line per task waiting for a node another Operation holds.
    pub waiting: &'a [String],
    /// One line per task a reboot gate holds ([`crate::reboot_gate`]).
    pub gated: &'a [String],
    /// A note saying what part of the spec is set aside, if any.
    pub ignored: Option<&'a str>,
    /// The Operation's `metadata.generation`.
    pub generation: Option<i64>,
    pub now: Timestamp,
}

/// Updates `status` from `input`: phase, counts, progress, observed generation, message and
/// the conditions `Blocked`, `Progressing`, `Complete`, [`NOTHING_DONE`] (once Succeeded),
/// the node-exclusion condition and [`SPEC_IGNORED`] (once it mattered).
pub fn summarize(status: &mut OperationStatus, input: &Summary<'_>) {
    let decision = input.schedule;
    status.phase = operation_transition(input.stored_phase, decision.phase);
    status.counts = decision.counts.clone();
    status.progress = Some(decision.progress.clone());
    status.observed_generation = input.generation;
    status.message = Some(message(input));
    blocked_condition(status, input);
    progress_conditions(status, input);
    held_condition(status, input);
    gate_condition(status, input);
    ignored_condition(status, input);
}

/// The Operation's message: the blocked tasks' messages, the scheduler's line, and before
/// them what the Operation waits for and a rollout control set aside.
fn message(input: &Summary<'_>) -> String {
    let decision = input.schedule;
    let blocked: Vec<String> = input
        .tasks
        .values()
        .filter(|t| {
            t.status
                .as_ref()
                .is_some_and(|s| s.phase == NodeTaskPhase::Blocked)
        })
        .map(|t| {
            let s = t
                .status
                .as_ref()
                .map(|s| s.message.clone().unwrap_or_default())
                .unwrap_or_default();
            format!("{}: {s}", t.spec.node_name)
        })
        .collect();
    let mut message = if blocked.is_empty() {
        decision.message.clone()
    } else {
        format!("{} — {}", blocked.join("; "), decision.message)
    };
    if !input.waiting.is_empty() {
        message = format!("{} — {message}", input.waiting.join("; "));
    }
    if !input.gated.is_empty() {
        message = format!("{} — {message}", input.gated.join("; "));
    }
    if let Some(note) = input.ignored {
        message = format!("{note} — {message}");
    }
    message
}

/// `Blocked`: true while the Operation is, with the first blocked task's reason.
fn blocked_condition(status: &mut OperationStatus, input: &Summary<'_>) {
    let is_blocked = status.phase == OperationPhase::Blocked;
    let block_reason = input
        .tasks
        .values()
        .filter_map(|t| t.status.as_ref())
        .find(|s| s.phase == NodeTaskPhase::Blocked)
        .and_then(|s| s.reason)
        .map_or(REASON_NOT_BLOCKED, BlockReason::as_str);
    set_condition(
        &mut status.conditions,
        "Blocked",
        is_blocked,
        block_reason,
        if is_blocked {
            status.message.as_deref().unwrap_or("")
        } else {
            ""
        },
        input.generation,
        input.now,
    );
}

/// `Progressing` and `Complete`, and once Succeeded, `NothingDone` when no node succeeded.
fn progress_conditions(status: &mut OperationStatus, input: &Summary<'_>) {
    let decision = input.schedule;
    let is_blocked = status.phase == OperationPhase::Blocked;
    let done = status.phase == OperationPhase::Succeeded;
    set_condition(
        &mut status.conditions,
        "Progressing",
        !done && !is_blocked && status.phase != OperationPhase::Paused,
        status.phase.as_str(),
        &decision.progress,
        input.generation,
        input.now,
    );
    set_condition(
        &mut status.conditions,
        "Complete",
        done,
        if done {
            "AllTasksFinished"
        } else {
            "InProgress"
        },
        "",
        input.generation,
        input.now,
    );
    if done {
        // Succeeded with no node succeeded (every one skipped or gone): nothing was done.
        let nothing = status.counts.succeeded == 0;
        let (reason, message) = if nothing {
            (
                REASON_NOTHING_DONE,
                "no node succeeded: every NodeTask was skipped or invalid, so nothing was done",
            )
        } else {
            (REASON_WORK_DONE, "")
        };
        set_condition(
            &mut status.conditions,
            NOTHING_DONE,
            nothing,
            reason,
            message,
            input.generation,
            input.now,
        );
    }
}

/// `NodeHeld`: true while a task waits for a node another Operation holds, saying which.
fn held_condition(status: &mut OperationStatus, input: &Summary<'_>) {
    let is_waiting = !input.waiting.is_empty();
    let held_reason = if is_waiting {
        crate::exclusion::REASON_HELD
    } else {
        crate::exclusion::REASON_FREE
    };
    set_condition(
        &mut status.conditions,
        crate::exclusion::CONDITION,
        is_waiting,
        held_reason,
        &input.waiting.join("; "),
        input.generation,
        input.now,
    );
}

/// `RebootGate`: true while a reboot gate holds a node, saying which gate holds which node.
/// Written once a gate has held one (other Operations never get it).
fn gate_condition(status: &mut OperationStatus, input: &Summary<'_>) {
    let had = status
        .conditions
        .iter()
        .any(|c| c.type_ == crate::reboot_gate::CONDITION);
    if input.gated.is_empty() && !had {
        return;
    }
    let (held, reason, message) = if input.gated.is_empty() {
        (
            false,
            crate::reboot_gate::REASON_CLEAR,
            "no gate holds a node".to_string(),
        )
    } else {
        (
            true,
            crate::reboot_gate::REASON_HELD,
            input.gated.join("; "),
        )
    };
    set_condition(
        &mut status.conditions,
        crate::reboot_gate::CONDITION,
        held,
        reason,
        &message,
        input.generation,
        input.now,
    );
}

/// `SpecIgnored`: a rollout control edited after freezing that could not be read.
fn ignored_condition(status: &mut OperationStatus, input: &Summary<'_>) {
    // Written once it matters: an Operation whose spec was always readable has no such
    // condition.
    match input.ignored {
        Some(note) => {
            set_condition(
                &mut status.conditions,
                SPEC_IGNORED,
                true,
                REASON_UNREADABLE,
                note,
                input.generation,
                input.now,
            );
        }
        None if status.conditions.iter().any(|c| c.type_ == SPEC_IGNORED) => {
            set_condition(
                &mut status.conditions,
                SPEC_IGNORED,
                false,
                REASON_READ,
                "",
                input.generation,
                input.now,
            );
        }
        None => {}
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use bosun_api::node_task::{NodeTask, NodeTaskStatus};
    use bosun_api::operation::TaskCounts;
    use serde_json::json;

    use super::*;

    fn task(
        node: &str,
        phase: NodeTaskPhase,
        reason: Option<BlockReason>,
        message: &str,
    ) -> Arc<NodeTask> {
        let spec = serde_json::from_value(json!({
            "operation": "op", "nodeName": node, "group": "all", "steps": []
        }))
        .unwrap();
        let mut t = NodeTask::new(&format!("op-{node}"), spec);
        t.status = Some(NodeTaskStatus {
            phase,
            reason,
            message: Some(message.into()),
            ..NodeTaskStatus::default()
        });
        Arc::new(t)
    }

    fn schedule(phase: OperationPhase, succeeded: u32) -> Schedule {
        Schedule {
            phase,
            counts: TaskCounts {
                planned: 2,
                succeeded,
                ..TaskCounts::default()
            },
            progress: format!("{succeeded}/2"),
            message: "group all".into(),
            ..Schedule::default()
        }
    }

    fn t0() -> Timestamp {
        "2026-01-01T00:00:00Z".parse().unwrap()
    }

    fn condition<'a>(s: &'a OperationStatus, type_: &str) -> (&'a str, &'a str, &'a str) {
        let c = s
            .conditions
            .iter()
            .find(|c| c.type_ == type_)
            .unwrap_or_else(|| panic!("no {type_} condition in {:?}", s.conditions));
        (c.status.as_str(), c.reason.as_str(), c.message.as_str())
    }

    fn summary(
        stored_phase: OperationPhase,
        schedule: &Schedule,
        tasks: &crate::reconcile::Tasks,
        waiting: &[String],
        ignored: Option<&str>,
    ) -> OperationStatus {
        let mut status = OperationStatus::default();
        summarize(
            &mut status,
            &Summary {
                stored_phase,
                schedule,
                tasks,
                waiting,
                gated: &[],
                ignored,
                generation: Some(4),
                now: t0(),
            },
        );
        status
    }

    #[test]
    fn a_blocked_task_names_its_reason_in_the_blocked_condition() {
        let tasks = BTreeMap::from([
            (
                "w1".to_string(),
                task(
                    "w1",
                    NodeTaskPhase::Blocked,
                    Some(BlockReason::DrainTimedOut),
                    "step drain: timed out",
                ),
            ),
            (
                "w2".to_string(),
                task("w2", NodeTaskPhase::Pending, None, ""),
            ),
        ]);
        let s = summary(
            OperationPhase::Running,
            &schedule(OperationPhase::Blocked, 0),
            &tasks,
            &[],
            None,
        );
        assert_eq!(s.phase, OperationPhase::Blocked);
        assert_eq!(s.observed_generation, Some(4));
        let message = "w1: step drain: timed out — group all";
        assert_eq!(s.message.as_deref(), Some(message));
        assert_eq!(condition(&s, "Blocked"), ("True", "DrainTimedOut", message));
        assert_eq!(condition(&s, "Progressing"), ("False", "Blocked", "0/2"));
        assert_eq!(condition(&s, "Complete"), ("False", "InProgress", ""));
        assert!(s.conditions.iter().all(|c| c.type_ != NOTHING_DONE));
        assert!(s.conditions.iter().all(|c| c.type_ != SPEC_IGNORED));
    }

    #[test]
    fn a_running_operation_is_progressing_and_not_blocked() {
        let tasks = BTreeMap::from([(
            "w1".to_string(),
            task("w1", NodeTaskPhase::Running, None, "running"),
        )]);
        let s = summary(
            OperationPhase::Pending,
            &schedule(OperationPhase::Running, 1),
            &tasks,
            &[],
            None,
        );
        assert_eq!(condition(&s, "Blocked"), ("False", REASON_NOT_BLOCKED, ""));
        assert_eq!(condition(&s, "Progressing"), ("True", "Running", "1/2"));
        assert_eq!(
            condition(&s, crate::exclusion::CONDITION),
            ("False", crate::exclusion::REASON_FREE, "")
        );
    }

    #[test]
    fn a_succeeded_operation_says_whether_any_node_did_work() {
        let tasks = BTreeMap::new();
        let s = summary(
            OperationPhase::Running,
            &schedule(OperationPhase::Succeeded, 0),
            &tasks,
            &[],
            None,
        );
        assert_eq!(condition(&s, "Complete"), ("True", "AllTasksFinished", ""));
        assert_eq!(condition(&s, "Progressing"), ("False", "Succeeded", "0/2"));
        assert_eq!(condition(&s, NOTHING_DONE).0, "True");
        assert_eq!(condition(&s, NOTHING_DONE).1, REASON_NOTHING_DONE);
        let s = summary(
            OperationPhase::Running,
            &schedule(OperationPhase::Succeeded, 2),
            &tasks,
            &[],
            None,
        );
        assert_eq!(condition(&s, NOTHING_DONE), ("False", REASON_WORK_DONE, ""));
    }

    #[test]
    fn a_finished_operation_keeps_its_phase() {
        let s = summary(
            OperationPhase::Failed,
            &schedule(OperationPhase::Running, 0),
            &BTreeMap::new(),
            &[],
            None,
        );
        assert_eq!(s.phase, OperationPhase::Failed);
    }

    #[test]
    fn waiting_nodes_and_a_set_aside_spec_lead_the_message_and_have_conditions() {
        let waiting = vec!["waiting: node w1 is held by Operation first".to_string()];
        let s = summary(
            OperationPhase::Running,
            &schedule(OperationPhase::Running, 0),
            &BTreeMap::new(),
            &waiting,
            Some("maxUnavailable is ignored"),
        );
        assert_eq!(
            s.message.as_deref(),
            Some(
                "maxUnavailable is ignored — waiting: node w1 is held by Operation first — group all"
            )
        );
        assert_eq!(
            condition(&s, crate::exclusion::CONDITION),
            (
                "True",
                crate::exclusion::REASON_HELD,
                "waiting: node w1 is held by Operation first"
            )
        );
        assert_eq!(
            condition(&s, SPEC_IGNORED),
            ("True", REASON_UNREADABLE, "maxUnavailable is ignored")
        );
        // Readable again: the condition turns False rather than vanishing.
        let mut again = s.clone();
        summarize(
            &mut again,
            &Summary {
                stored_phase: OperationPhase::Running,
                schedule: &schedule(OperationPhase::Running, 0),
                tasks: &BTreeMap::new(),
                waiting: &[],
                gated: &[],
                ignored: None,
                generation: Some(4),
                now: t0(),
            },
        );
        assert_eq!(condition(&again, SPEC_IGNORED), ("False", REASON_READ, ""));
        assert_eq!(again.message.as_deref(), Some("group all"));
    }

    #[test]
    fn a_node_held_by_a_reboot_gate_leads_the_message_and_has_a_condition_once_it_mattered() {
        let run = |status: &mut OperationStatus, gated: &[String]| {
            summarize(
                status,
                &Summary {
                    stored_phase: OperationPhase::Running,
                    schedule: &schedule(OperationPhase::Running, 0),
                    tasks: &BTreeMap::new(),
                    waiting: &[],
                    gated,
                    ignored: None,
                    generation: Some(4),
                    now: t0(),
                },
            )
        };
        let gate = |s: &OperationStatus| {
            s.conditions
                .iter()
                .find(|c| c.type_ == crate::reboot_gate::CONDITION)
                .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        };
        // Never held: no condition.
        let mut s = OperationStatus::default();
        run(&mut s, &[]);
        assert_eq!(gate(&s), None);
        let line = "pod a/j1 on node w-1 matches spec.reboot.blockingPodSelector: …".to_string();
        run(&mut s, std::slice::from_ref(&line));
        assert!(
            s.message
                .as_deref()
                .unwrap()
                .starts_with(&format!("{line} — ")),
            "{:?}",
            s.message
        );
        assert_eq!(
            gate(&s),
            Some((
                "True".into(),
                crate::reboot_gate::REASON_HELD.into(),
                line.clone()
            ))
        );
        // Released: False, not gone.
        run(&mut s, &[]);
        assert_eq!(
            gate(&s).map(|g| (g.0, g.1)),
            Some(("False".into(), crate::reboot_gate::REASON_CLEAR.into()))
        );
        assert!(!s.message.as_deref().unwrap().contains("w-1"));
    }
}
