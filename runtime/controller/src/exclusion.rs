//! One Operation at a time per node: a NodeTask does not start while its node is held by a
//! NodeTask of another Operation of the same instance.
//!
//! A task holds its node while its phase is AwaitingApproval, Running or Blocked
//! ([`holds_node`], the same phases that hold a rollout slot): Running because steps run on
//! the node; Blocked because the node may be half-changed, cordoned or drained and a person
//! must decide (retry or skip) before anyone else touches it; AwaitingApproval because its
//! approval would otherwise start work on a node another Operation is changing. Pending and
//! finished tasks (Succeeded, Skipped, Invalid) hold nothing, and neither does a Blocked
//! task of a DryRun Operation: a dry run changed nothing (the host enforces it), so the
//! node is as it was and the next real Operation need not wait for someone to resolve it.
//! Retrying such a task later runs it again without taking the node back: a dry run beside
//! a real Operation on one node changes nothing either.
//!
//! Only the Operations of the controller's own instance (`--instance`) are considered: an
//! install acts only on its own objects and cannot see another install's agents, so it
//! cannot wait on them or release them (see docs/operator.md).
//!
//! The decision ([`holders`]) is a pure function of the other Operations' tasks; the
//! reconciler takes [`Context::exclusion`](crate::Context) around reading them and starting
//! its tasks, so two Operations reconciled at the same moment cannot both take a node.

use std::collections::{BTreeMap, BTreeSet};

use bosun_api::node_task::{NodeTask, NodeTaskPhase};
use kube::ResourceExt;

/// The NodeTask and Operation condition type that says a node is held by another
/// Operation. On a task it is present (True) only while it waits; the controller's next
/// write when the task starts drops it.
pub const CONDITION: &str = "NodeHeld";

/// The condition's reason while a node is held.
pub const REASON_HELD: &str = "HeldByOtherOperation";

/// The Operation condition's reason when none of its nodes is held.
pub const REASON_FREE: &str = "NoNodeHeld";

/// True for the phases in which a task holds its node against other Operations.
pub fn holds_node(phase: NodeTaskPhase) -> bool {
    phase.occupies_slot()
}

/// The task of another Operation that holds a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub node: String,
    pub operation: String,
    pub task: String,
    pub phase: NodeTaskPhase,
}

impl Holder {
    /// One line for the waiting task's and Operation's status.
    pub fn message(&self) -> String {
        format!(
            "waiting: node {} is held by Operation {} (task {}, {:?})",
            self.node, self.operation, self.task, self.phase
        )
    }
}

/// Operations waiting for a node another Operation holds, by node. The controller wakes
/// them on a change of any task on that node (see [`Waiters::woken_by`]) instead of
/// looking again on a timer: a holder finishing (or going away) is a change of its task.
///
/// A reconcile registers its wanted nodes *before* it reads the holders and forgets those
/// it found free, so a holder that finishes after the read always finds the waiter.
#[derive(Debug, Default)]
pub struct Waiters(std::sync::Mutex<BTreeMap<String, BTreeSet<String>>>);

impl Waiters {
    fn table(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, BTreeSet<String>>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `operation` waits for `node`.
    pub fn wait(&self, node: &str, operation: &str) {
        self.table()
            .entry(node.to_string())
            .or_default()
            .insert(operation.to_string());
    }

    /// `operation` no longer waits for `node`.
    pub fn forget(&self, node: &str, operation: &str) {
        let mut table = self.table();
        if let Some(ops) = table.get_mut(node) {
            ops.remove(operation);
            if ops.is_empty() {
                table.remove(node);
            }
        }
    }

    /// The Operations to wake for a change of `task` (any change, deletion included, of a
    /// task of another Operation on a node they wait for), removed from the table: a woken
    /// Operation that still finds the node held registers again.
    pub fn woken_by(&self, task: &NodeTask) -> Vec<String> {
        let mut table = self.table();
        let Some(ops) = table.get_mut(&task.spec.node_name) else {
            return Vec::new();
        };
        let woken: Vec<String> = ops
            .iter()
            .filter(|op| **op != task.spec.operation)
            .cloned()
            .collect();
        for op in &woken {
            ops.remove(op);
        }
        if ops.is_empty() {
            table.remove(&task.spec.node_name);
        }
        woken
    }
}

/// The holder of each node held by a task of an Operation other than `operation`, among
/// `tasks` (the NodeTasks of the instance). When several tasks hold one node (only possible
/// if they were started before this rule existed), the first by name is named.
pub fn holders<'a>(
    operation: &str,
    tasks: impl IntoIterator<Item = &'a NodeTask>,
) -> BTreeMap<String, Holder> {
    let mut out: BTreeMap<String, Holder> = BTreeMap::new();
    for task in tasks {
        let phase = task.status.as_ref().map(|s| s.phase).unwrap_or_default();
        if task.spec.operation == operation
            || !holds_node(phase)
            || released_by_dry_run(task, phase)
        {
            continue;
        }
        let holder = Holder {
            node: task.spec.node_name.clone(),
            operation: task.spec.operation.clone(),
            task: task.name_any(),
            phase,
        };
        match out.get(&holder.node) {
            Some(h) if h.task <= holder.task => {}
            _ => {
                out.insert(holder.node.clone(), holder);
            }
        }
    }
    out
}

/// A Blocked dry-run task: it holds its rollout slot (its Operation waits for a person) but
/// not its node (see the module docs).
fn released_by_dry_run(task: &NodeTask, phase: NodeTaskPhase) -> bool {
    task.spec.dry_run && phase == NodeTaskPhase::Blocked
}

/// Whether moving a task from `from` needs the node to be free: a task that already holds
/// its node (AwaitingApproval being approved) keeps it; a Pending task takes it.
pub fn needs_node(from: NodeTaskPhase) -> bool {
    !holds_node(from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bosun_api::node_task::{NodeTaskSpec, NodeTaskStatus};

    fn task(op: &str, node: &str, phase: NodeTaskPhase) -> NodeTask {
        let spec = NodeTaskSpec {
            operation: op.into(),
            node_name: node.into(),
            group: "workers".into(),
            steps: vec![],
            dry_run: false,
            step_timeout_seconds: None,
            approve: false,
            recovery: None,
        };
        let mut t = NodeTask::new(&format!("{op}-{node}"), spec);
        t.status = Some(NodeTaskStatus {
            phase,
            ..Default::default()
        });
        t
    }

    #[test]
    fn running_blocked_and_awaiting_approval_hold_the_node_others_do_not() {
        use NodeTaskPhase::*;
        for (phase, holds) in [
            (Pending, false),
            (AwaitingApproval, true),
            (Running, true),
            (Blocked, true),
            (Succeeded, false),
            (Skipped, false),
            (Invalid, false),
        ] {
            assert_eq!(holds_node(phase), holds, "{phase:?}");
            let held = holders("b", [&task("a", "w1", phase)]);
            assert_eq!(held.contains_key("w1"), holds, "{phase:?}");
        }
    }

    #[test]
    fn a_blocked_dry_run_holds_no_node_but_a_running_one_does() {
        let dry = |phase| {
            let mut t = task("dry", "w1", phase);
            t.spec.dry_run = true;
            t
        };
        assert!(holders("real", [&dry(NodeTaskPhase::Blocked)]).is_empty());
        assert!(holders("real", [&dry(NodeTaskPhase::Running)]).contains_key("w1"));
        assert!(holders("real", [&dry(NodeTaskPhase::AwaitingApproval)]).contains_key("w1"));
        // A real Operation's blocked task still holds it.
        assert!(holders("real", [&task("other", "w1", NodeTaskPhase::Blocked)]).contains_key("w1"));
    }

    #[test]
    fn the_message_names_node_operation_task_and_phase() {
        let tasks = [
            task("upgrade-x", "worker-1", NodeTaskPhase::Blocked),
            task("upgrade-x", "worker-2", NodeTaskPhase::Succeeded),
        ];
        let held = holders("upgrade-y", &tasks);
        assert_eq!(held.len(), 1);
        assert_eq!(
            held["worker-1"].message(),
            "waiting: node worker-1 is held by Operation upgrade-x (task upgrade-x-worker-1, Blocked)"
        );
    }

    #[test]
    fn an_operations_own_tasks_never_hold_it_back() {
        let tasks = [
            task("a", "w1", NodeTaskPhase::Running),
            task("b", "w2", NodeTaskPhase::Running),
        ];
        let held = holders("a", &tasks);
        assert_eq!(held.keys().collect::<Vec<_>>(), ["w2"]);
        assert_eq!(held["w2"].operation, "b");
    }

    #[test]
    fn a_task_without_status_is_pending_and_holds_nothing() {
        let mut t = task("a", "w1", NodeTaskPhase::Running);
        t.status = None;
        assert!(holders("b", [&t]).is_empty());
    }

    #[test]
    fn of_two_holders_the_first_by_name_is_named_whatever_the_order() {
        let tasks = [
            task("z", "w1", NodeTaskPhase::Running),
            task("m", "w1", NodeTaskPhase::Blocked),
        ];
        assert_eq!(holders("a", &tasks)["w1"].operation, "m");
        let reversed = [tasks[1].clone(), tasks[0].clone()];
        assert_eq!(holders("a", &reversed)["w1"].operation, "m");
    }

    #[test]
    fn only_a_pending_task_needs_the_node_to_be_free() {
        assert!(needs_node(NodeTaskPhase::Pending));
        assert!(!needs_node(NodeTaskPhase::AwaitingApproval));
    }

    #[test]
    fn a_change_of_the_holders_task_wakes_the_waiting_operation_once() {
        let waiters = Waiters::default();
        waiters.wait("n1", "op-b");
        waiters.wait("n1", "op-c");
        waiters.wait("n2", "op-b");
        // A change of a task of op-b itself on n1 wakes only the others waiting there.
        let own = task("op-b", "n1", NodeTaskPhase::Pending);
        assert_eq!(waiters.woken_by(&own), vec!["op-c".to_string()]);
        // The holder (op-a) finishing on n1 wakes op-b; op-c was already woken.
        let holder = task("op-a", "n1", NodeTaskPhase::Succeeded);
        assert_eq!(waiters.woken_by(&holder), vec!["op-b".to_string()]);
        assert!(waiters.woken_by(&holder).is_empty(), "woken once");
        // A task on a node nobody waits for wakes nobody; n2 is still waited for.
        assert!(
            waiters
                .woken_by(&task("op-a", "n3", NodeTaskPhase::Succeeded))
                .is_empty()
        );
        waiters.forget("n2", "op-b");
        assert!(
            waiters
                .woken_by(&task("op-a", "n2", NodeTaskPhase::Succeeded))
                .is_empty()
        );
    }
}
