//! What the bench's NodeTask watch saw during a run: every version of every task, reduced
//! to what tells whether a step ran twice (counts, never times) and when the controller
//! wrote (to time a restarted controller's resume).
//!
//! A step ran twice when its task shows `attempts` above 1 for it, when the watch saw it
//! with two different start times (a step started again from scratch, even if its attempts
//! were written back as 1), or when a controller step (cordon, uncordon of a schedulable
//! node) found nothing to do. A task was created twice when one node of one Operation had two
//! tasks (two UIDs).

use std::collections::{BTreeMap, BTreeSet};

use bosun_api::node_task::{NodeTask, NodeTaskPhase, StepPhase};
use bosun_api::operation::RunsOn;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

/// A step's status as the ledger keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct StepView {
    phase: StepPhase,
    attempts: u32,
    started_us: Option<i64>,
    finished_us: Option<i64>,
}

/// A task's status as the ledger keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct TaskView {
    phase: NodeTaskPhase,
    steps: BTreeMap<String, StepView>,
}

impl TaskView {
    fn of(task: &NodeTask) -> TaskView {
        let status = task.status.clone().unwrap_or_default();
        TaskView {
            phase: status.phase,
            steps: status
                .steps
                .iter()
                .map(|s| {
                    (
                        s.name.clone(),
                        StepView {
                            phase: s.phase,
                            attempts: s.attempts,
                            started_us: s.started_at.as_ref().map(|t| t.0.as_microsecond()),
                            finished_us: s.finished_at.as_ref().map(|t| t.0.as_microsecond()),
                        },
                    )
                })
                .collect(),
        }
    }
}

/// One task as first and last seen.
#[derive(Clone, Debug)]
struct TaskSeen {
    name: String,
    node: String,
    operation: String,
    /// Names of the steps the controller runs.
    controller_steps: BTreeSet<String>,
    last: TaskView,
}

/// One step of one task over the run.
#[derive(Clone, Debug, Default)]
struct StepSeen {
    /// Every distinct start time seen (µs since the epoch).
    starts: BTreeSet<i64>,
    max_attempts: u32,
}

/// Whether the change from `prev` (`None`: the task is new) to `next` is the controller's
/// doing: creating the task, moving it Running or Succeeded, or writing one of its own
/// steps (`controller_steps`). The agent writes its steps, its facts and, when a step
/// fails, the task's Blocked phase.
fn controller_change(
    prev: Option<&TaskView>,
    next: &TaskView,
    controller_steps: &BTreeSet<String>,
) -> bool {
    let Some(prev) = prev else {
        return true;
    };
    if prev.phase != next.phase
        && matches!(
            next.phase,
            NodeTaskPhase::Running | NodeTaskPhase::Succeeded
        )
    {
        return true;
    }
    controller_steps
        .iter()
        .any(|s| prev.steps.get(s) != next.steps.get(s))
}

/// Every NodeTask version the bench's watch delivered, reduced.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    /// By UID.
    tasks: BTreeMap<String, TaskSeen>,
    /// By (task UID, step name).
    steps: BTreeMap<(String, String), StepSeen>,
    /// When each change the controller made was seen (µs since the epoch), in arrival
    /// order.
    controller_writes_us: Vec<i64>,
}

/// What [`Ledger::check`] found. Both lists empty ([`OnceCheck::passed`]): no step ran
/// twice and no task was created twice.
#[derive(Clone, Debug, Default)]
pub struct OnceCheck {
    /// Tasks of the Operation seen (distinct UIDs).
    pub tasks_seen: usize,
    /// Step statuses checked in the final tasks.
    pub steps_checked: usize,
    /// One line for each step that ran twice as the status records it (attempts above 1,
    /// a second start time) and each task created twice.
    pub violations: Vec<String>,
    /// One line for each controller step that ran again without a record of its first
    /// run (it found nothing to do): its first run's effect landed, its status write did
    /// not (the controller was killed in between).
    pub unrecorded_reruns: Vec<String>,
}

impl OnceCheck {
    /// No step ran twice, recorded or not, and no task was created twice.
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.unrecorded_reruns.is_empty()
    }
}

impl Ledger {
    /// Records one version of `task`, seen at `seen_at`.
    pub fn observe(&mut self, task: &NodeTask, seen_at: Timestamp) {
        let Some(uid) = task.metadata.uid.clone() else {
            return;
        };
        let next = TaskView::of(task);
        for (name, step) in &next.steps {
            let seen = self.steps.entry((uid.clone(), name.clone())).or_default();
            if let Some(s) = step.started_us {
                seen.starts.insert(s);
            }
            seen.max_attempts = seen.max_attempts.max(step.attempts);
        }
        let prev = self.tasks.get(&uid);
        if prev.is_some_and(|p| p.last == next) {
            return;
        }
        let controller_steps = prev.map_or_else(
            || {
                task.spec
                    .steps
                    .iter()
                    .filter(|s| s.runs_on == RunsOn::Controller)
                    .map(|s| s.name.clone())
                    .collect()
            },
            |p| p.controller_steps.clone(),
        );
        if controller_change(prev.map(|p| &p.last), &next, &controller_steps) {
            self.controller_writes_us.push(seen_at.as_microsecond());
        }
        self.tasks.insert(
            uid,
            TaskSeen {
                name: task.name_any(),
                node: task.spec.node_name.clone(),
                operation: task.spec.operation.clone(),
                controller_steps,
                last: next,
            },
        );
    }

    /// Tasks of `operation` last seen Succeeded.
    pub fn succeeded(&self, operation: &str) -> usize {
        self.tasks
            .values()
            .filter(|t| t.operation == operation && t.last.phase == NodeTaskPhase::Succeeded)
            .count()
    }

    /// The first change by the controller seen at or after `at`.
    pub fn first_controller_write_after(&self, at: Timestamp) -> Option<Timestamp> {
        let at = at.as_microsecond();
        self.controller_writes_us
            .iter()
            .copied()
            .filter(|&t| t >= at)
            .min()
            .and_then(|t| Timestamp::from_microsecond(t).ok())
    }

    /// Checks `operation`'s tasks: in the final list `tasks`, every step's attempts is 1
    /// and so is every task's, and every controller step changed its node; in what the
    /// watch saw, every step of a task started at one time only, and each node had one
    /// task.
    ///
    /// The controller steps' `changed` catches a run that left no trace in the status: the
    /// bench's steps are cordon and uncordon of nodes that start schedulable, so each
    /// changes its node once; one that found nothing to do ran after an earlier run of
    /// itself whose status was never written (a controller killed between its Node patch
    /// and its status write).
    pub fn check(&self, operation: &str, tasks: &[NodeTask]) -> OnceCheck {
        let mut violations = Vec::new();
        let mut unrecorded_reruns = Vec::new();
        for task in tasks {
            let name = task.name_any();
            let status = task.status.clone().unwrap_or_default();
            if status.attempts > 1 {
                violations.push(format!(
                    "task {name}: the task was started {} times",
                    status.attempts
                ));
            }
            for step in &status.steps {
                if step.attempts != 1 {
                    violations.push(format!(
                        "task {name}: step {} has attempts {}",
                        step.name, step.attempts
                    ));
                }
                let by_controller = task
                    .spec
                    .steps
                    .iter()
                    .any(|s| s.name == step.name && s.runs_on == RunsOn::Controller);
                if by_controller && step.changed == Some(false) {
                    unrecorded_reruns.push(format!(
                        "task {name}: step {} found nothing to do (changed: false): it had already run",
                        step.name
                    ));
                }
            }
        }
        let mine: BTreeMap<&String, &TaskSeen> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.operation == operation)
            .collect();
        let mut by_node: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for t in mine.values() {
            by_node.entry(&t.node).or_default().push(&t.name);
        }
        for (node, names) in &by_node {
            if names.len() > 1 {
                violations.push(format!(
                    "node {node}: {} tasks created ({})",
                    names.len(),
                    names.join(", ")
                ));
            }
        }
        for ((uid, step), seen) in &self.steps {
            let Some(t) = mine.get(uid) else { continue };
            if seen.starts.len() > 1 {
                violations.push(format!(
                    "task {}: step {step} started {} times (distinct start times seen)",
                    t.name,
                    seen.starts.len()
                ));
            }
            if seen.max_attempts > 1 {
                violations.push(format!(
                    "task {}: step {step} was seen at attempt {}",
                    t.name, seen.max_attempts
                ));
            }
        }
        OnceCheck {
            tasks_seen: mine.len(),
            steps_checked: tasks
                .iter()
                .map(|t| t.status.as_ref().map_or(0, |s| s.steps.len()))
                .sum(),
            violations,
            unrecorded_reruns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const OP: &str = "op";

    /// A task of [`OP`] on `node` with uid `uid`: steps cordon (controller), noop (agent),
    /// uncordon (controller); `steps` are (name, phase, attempts, start second).
    fn task(uid: &str, node: &str, phase: &str, steps: &[(&str, &str, u32, i64)]) -> NodeTask {
        let at = |s: i64| {
            Timestamp::from_second(1_800_000_000 + s)
                .unwrap()
                .to_string()
        };
        let steps: Vec<_> = steps
            .iter()
            .map(|(name, phase, attempts, start)| {
                json!({ "name": name, "phase": phase, "attempts": attempts, "startedAt": at(*start),
                        "changed": true })
            })
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeTask",
            "metadata": { "name": format!("{OP}-{node}-{uid}"), "uid": uid },
            "spec": { "operation": OP, "nodeName": node, "group": "g", "steps": [
                { "name": "cordon", "runsOn": "controller", "action": "cordon" },
                { "name": "noop", "plugin": "p", "action": "sleep" },
                { "name": "uncordon", "runsOn": "controller", "action": "uncordon" },
            ] },
            "status": { "phase": phase, "attempts": 1, "steps": steps },
        }))
        .unwrap()
    }

    fn at_ms(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(1_900_000_000_000 + ms).unwrap()
    }

    #[test]
    fn a_task_run_once_passes_and_its_controller_writes_are_told_from_the_agents() {
        let mut l = Ledger::default();
        let versions = [
            task("u1", "n1", "Pending", &[]), // created: controller
            task("u1", "n1", "Running", &[]), // Running: controller
            task("u1", "n1", "Running", &[("cordon", "Succeeded", 1, 1)]), // controller step
            task(
                "u1",
                "n1",
                "Running",
                &[("cordon", "Succeeded", 1, 1), ("noop", "Running", 1, 2)],
            ), // agent
            task(
                "u1",
                "n1",
                "Running",
                &[("cordon", "Succeeded", 1, 1), ("noop", "Succeeded", 1, 2)],
            ), // agent
            task(
                "u1",
                "n1",
                "Running",
                &[
                    ("cordon", "Succeeded", 1, 1),
                    ("noop", "Succeeded", 1, 2),
                    ("uncordon", "Succeeded", 1, 3),
                ],
            ), // controller step
        ];
        for (i, v) in versions.iter().enumerate() {
            l.observe(v, at_ms(i as i64 * 100));
        }
        let done = task(
            "u1",
            "n1",
            "Succeeded",
            &[
                ("cordon", "Succeeded", 1, 1),
                ("noop", "Succeeded", 1, 2),
                ("uncordon", "Succeeded", 1, 3),
            ],
        );
        l.observe(&done, at_ms(600)); // Succeeded: controller
        // The same version again (a relist) is no write.
        l.observe(&done, at_ms(700));
        assert_eq!(l.controller_writes_us.len(), 5);
        assert_eq!(l.succeeded(OP), 1);
        assert_eq!(l.succeeded("other"), 0);
        // After 250 ms the agent wrote twice, then the controller at 500 ms.
        assert_eq!(l.first_controller_write_after(at_ms(250)), Some(at_ms(500)));
        assert_eq!(l.first_controller_write_after(at_ms(601)), None);
        let c = l.check(OP, &[done]);
        assert_eq!(c.violations, Vec::<String>::new());
        assert_eq!((c.tasks_seen, c.steps_checked), (1, 3));
    }

    #[test]
    fn a_step_started_again_fails_even_with_attempts_one() {
        let mut l = Ledger::default();
        l.observe(
            &task("u1", "n1", "Running", &[("cordon", "Succeeded", 1, 1)]),
            at_ms(0),
        );
        // The status was rewritten with a new start: the step ran from scratch again.
        let again = task("u1", "n1", "Running", &[("cordon", "Succeeded", 1, 5)]);
        l.observe(&again, at_ms(100));
        let c = l.check(OP, &[again]);
        assert_eq!(c.violations.len(), 1, "{:?}", c.violations);
        assert!(c.violations[0].contains("step cordon started 2 times"));
    }

    #[test]
    fn a_controller_step_that_found_nothing_to_do_had_run_before() {
        let mut again = task(
            "u1",
            "n1",
            "Running",
            &[("cordon", "Succeeded", 1, 1), ("noop", "Succeeded", 1, 2)],
        );
        let mut l = Ledger::default();
        l.observe(&again, at_ms(0));
        assert!(l.check(OP, std::slice::from_ref(&again)).passed());
        // The agent's step changing nothing is no sign of a second run; the cordon's is.
        let steps = &mut again.status.as_mut().unwrap().steps;
        steps[1].changed = Some(false);
        assert!(l.check(OP, std::slice::from_ref(&again)).passed());
        again.status.as_mut().unwrap().steps[0].changed = Some(false);
        let c = l.check(OP, &[again]);
        assert!(c.violations.is_empty(), "{:?}", c.violations);
        assert_eq!(c.unrecorded_reruns.len(), 1, "{:?}", c.unrecorded_reruns);
        assert!(c.unrecorded_reruns[0].contains("step cordon found nothing to do"));
        assert!(!c.passed());
    }

    #[test]
    fn a_retried_step_and_a_task_created_twice_fail() {
        let mut l = Ledger::default();
        let first = task("u1", "n1", "Running", &[("noop", "Running", 1, 1)]);
        l.observe(&first, at_ms(0));
        let retried = task("u1", "n1", "Running", &[("noop", "Running", 2, 1)]);
        l.observe(&retried, at_ms(100));
        // Another task for the same node of the same Operation.
        let second = task("u2", "n1", "Pending", &[]);
        l.observe(&second, at_ms(200));
        // A task of another Operation on that node is not this one's concern.
        let mut other = task("u3", "n1", "Pending", &[]);
        other.spec.operation = "other".into();
        l.observe(&other, at_ms(300));
        let c = l.check(OP, &[retried, second]);
        assert_eq!(c.tasks_seen, 2);
        let all = c.violations.join("\n");
        assert_eq!(c.violations.len(), 3, "{all}");
        assert!(all.contains("step noop has attempts 2"), "{all}");
        assert!(all.contains("step noop was seen at attempt 2"), "{all}");
        assert!(all.contains("node n1: 2 tasks created"), "{all}");
    }
}
