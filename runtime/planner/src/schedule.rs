//! Which NodeTasks may start now: the rollout decision, made from the frozen plan and the
//! tasks' current phases.
//!
//! Rules, in order of precedence:
//! 1. A planned node that is no longer in the cluster makes its unfinished task Invalid
//!    (visible in status); Invalid counts as finished, so the rollout goes on without it.
//! 2. Groups run in plan order: nothing in a group starts before every task of the groups
//!    before it has finished (Succeeded, Skipped or Invalid).
//! 3. A Blocked task anywhere stops progress: nothing new starts until a person sets its
//!    `recovery`. `spec.paused` stops progress too. Running tasks are never stopped.
//! 4. In the current group at most `max_parallel` tasks hold a slot (AwaitingApproval,
//!    Running or Blocked), and at most one control-plane node in the whole Operation.
//! 5. Tasks start in plan order. In Controlled mode a task whose turn came waits in
//!    AwaitingApproval (holding its slot) until `spec.approve` is true.
//!
//! The controller applies the result with the transitions of [`crate::state`], creating
//! any missing NodeTasks first.

use std::collections::{BTreeMap, BTreeSet};

use bosun_api::node_task::NodeTaskPhase;
use bosun_api::operation::{ExecutionMode, OperationPhase, Plan, PlannedGroup, TaskCounts};

/// What the scheduler needs to know about one existing NodeTask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskView {
    pub phase: NodeTaskPhase,
    /// `spec.approve`.
    pub approve: bool,
}

/// The scheduling decision. Node names, in plan order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    /// Planned nodes that have no NodeTask yet: create them (Pending).
    pub create: Vec<String>,
    /// Tasks whose node vanished: move them to Invalid.
    pub invalidate: Vec<String>,
    /// Tasks to move to Running (from Pending, or from AwaitingApproval once approved).
    pub start: Vec<String>,
    /// Pending tasks whose turn came in Controlled mode: move them to AwaitingApproval.
    pub await_approval: Vec<String>,
    /// The Operation's phase once these moves are applied.
    pub phase: OperationPhase,
    /// Task counts once these moves are applied.
    pub counts: TaskCounts,
    /// `finished/planned`.
    pub progress: String,
    /// The group being worked on, if any.
    pub current_group: Option<String>,
    /// One line for the Operation's status.
    pub message: String,
}

/// Decides what may happen now.
///
/// `tasks` maps node name → its NodeTask (tasks for nodes outside the plan are ignored);
/// `present` is the set of node names in the cluster now.
///
/// Guarantees: never starts a task outside the first unfinished group; never lets more than
/// `max_parallel` tasks of that group hold a slot, nor two control-plane nodes; starts
/// nothing while a task is Blocked or the Operation is paused; never returns a node in two
/// of `start`, `await_approval`, `invalidate`.
pub fn schedule(
    plan: &Plan,
    tasks: &BTreeMap<String, TaskView>,
    present: &BTreeSet<String>,
    paused: bool,
    mode: ExecutionMode,
) -> Schedule {
    let mut out = Schedule::default();
    let mut phase = phases_now(plan, tasks, present, &mut out);
    let blocked: Vec<&str> = in_phase(&phase, NodeTaskPhase::Blocked);
    let current = plan
        .groups
        .iter()
        .find(|g| g.nodes.iter().any(|n| !phase[n.as_str()].is_finished()));
    out.current_group = current.map(|g| g.name.clone());
    if let Some(group) = current.filter(|_| blocked.is_empty() && !paused) {
        pick(plan, group, tasks, &phase, mode, &mut out);
    }
    for node in &out.start {
        phase.insert(node, NodeTaskPhase::Running);
    }
    for node in &out.await_approval {
        phase.insert(node, NodeTaskPhase::AwaitingApproval);
    }
    let counts = count(&phase);
    let finished = counts.succeeded + counts.skipped + counts.invalid;
    out.progress = format!("{finished}/{}", counts.planned);
    (out.phase, out.message) = if current.is_none() {
        (
            OperationPhase::Succeeded,
            finished_message(&counts, &in_phase(&phase, NodeTaskPhase::Invalid)),
        )
    } else if !blocked.is_empty() {
        (
            OperationPhase::Blocked,
            format!(
                "blocked on {blocked:?}: see `kubectl bosun status`, fix the cause, then `kubectl bosun retry` or `kubectl bosun skip` (spec.recovery on the NodeTask)"
            ),
        )
    } else if paused {
        (
            OperationPhase::Paused,
            "paused: running steps finish, nothing new starts; set spec.paused: false to resume"
                .into(),
        )
    } else if let (0, awaiting @ [_, ..]) = (
        counts.running,
        in_phase(&phase, NodeTaskPhase::AwaitingApproval).as_slice(),
    ) {
        (
            OperationPhase::AwaitingApproval,
            format!(
                "waiting for approval of {awaiting:?}: `kubectl bosun approve` (spec.approve: true on the NodeTask)"
            ),
        )
    } else {
        let group = out.current_group.as_deref().unwrap_or_default();
        (
            OperationPhase::Running,
            format!(
                "group {group}: {} running, {}/{} nodes finished",
                counts.running, finished, counts.planned
            ),
        )
    };
    out.counts = counts;
    out
}

/// The phase every planned node has after this round's invalidations (rule 1); records in
/// `out` the tasks to create and to invalidate.
fn phases_now<'a>(
    plan: &'a Plan,
    tasks: &BTreeMap<String, TaskView>,
    present: &BTreeSet<String>,
    out: &mut Schedule,
) -> BTreeMap<&'a str, NodeTaskPhase> {
    let mut phase = BTreeMap::new();
    for node in plan.node_names() {
        let current = match tasks.get(node) {
            Some(task) => task.phase,
            None => {
                out.create.push(node.to_string());
                NodeTaskPhase::Pending
            }
        };
        if !present.contains(node) && !current.is_finished() {
            out.invalidate.push(node.to_string());
            phase.insert(node, NodeTaskPhase::Invalid);
        } else {
            phase.insert(node, current);
        }
    }
    phase
}

/// The nodes in `wanted`, by name.
fn in_phase<'a>(phase: &BTreeMap<&'a str, NodeTaskPhase>, wanted: NodeTaskPhase) -> Vec<&'a str> {
    phase
        .iter()
        .filter(|(_, p)| **p == wanted)
        .map(|(n, _)| *n)
        .collect()
}

/// Rules 4 and 5 in the current group: which Pending tasks take a free slot (started, or
/// awaiting approval in Controlled mode), and which approved ones start.
fn pick(
    plan: &Plan,
    group: &PlannedGroup,
    tasks: &BTreeMap<String, TaskView>,
    phase: &BTreeMap<&str, NodeTaskPhase>,
    mode: ExecutionMode,
    out: &mut Schedule,
) {
    let control_plane: BTreeSet<&str> = plan
        .groups
        .iter()
        .flat_map(|g| g.control_plane_nodes.iter().map(String::as_str))
        .collect();
    let mut used = group
        .nodes
        .iter()
        .filter(|n| phase[n.as_str()].occupies_slot())
        .count();
    let mut control_plane_busy = phase
        .iter()
        .any(|(n, p)| p.occupies_slot() && control_plane.contains(n));
    let max = usize::try_from(group.max_parallel.max(1)).unwrap_or(usize::MAX);
    for node in &group.nodes {
        let Some(task) = tasks.get(node) else {
            continue;
        };
        match phase[node.as_str()] {
            // Already holds its slot; starts once approved.
            NodeTaskPhase::AwaitingApproval if task.approve => out.start.push(node.clone()),
            NodeTaskPhase::Pending => {
                let is_cp = control_plane.contains(node.as_str());
                if used >= max || (is_cp && control_plane_busy) {
                    continue;
                }
                used += 1;
                control_plane_busy |= is_cp;
                if mode == ExecutionMode::Controlled && !task.approve {
                    out.await_approval.push(node.clone());
                } else {
                    out.start.push(node.clone());
                }
            }
            _ => {}
        }
    }
}

/// How many tasks are in each phase, and planned.
fn count(phase: &BTreeMap<&str, NodeTaskPhase>) -> TaskCounts {
    let mut counts = TaskCounts::default();
    for p in phase.values() {
        let slot = match p {
            NodeTaskPhase::Pending => &mut counts.pending,
            NodeTaskPhase::AwaitingApproval => &mut counts.awaiting_approval,
            NodeTaskPhase::Running => &mut counts.running,
            NodeTaskPhase::Blocked => &mut counts.blocked,
            NodeTaskPhase::Succeeded => &mut counts.succeeded,
            NodeTaskPhase::Skipped => &mut counts.skipped,
            NodeTaskPhase::Invalid => &mut counts.invalid,
        };
        *slot += 1;
    }
    counts.planned = u32::try_from(phase.len()).unwrap_or(u32::MAX);
    counts
}

/// The message of a finished Operation.
fn finished_message(counts: &TaskCounts, invalid: &[&str]) -> String {
    let mut message = if counts.succeeded == 0 {
        // Succeeded only in the sense that nothing is left to do: say so first.
        format!(
            "finished with nothing done: no node succeeded ({} skipped, {} invalid)",
            counts.skipped, counts.invalid
        )
    } else {
        format!(
            "finished: {} succeeded, {} skipped, {} invalid",
            counts.succeeded, counts.skipped, counts.invalid
        )
    };
    if !invalid.is_empty() {
        message.push_str(&format!(" (nodes {invalid:?} left the cluster)"));
    }
    message
}
