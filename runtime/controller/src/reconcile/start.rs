//! The **start** phase: the scheduler's moves applied. Tasks whose node left are blocked
//! (Invalid); the operation gate holds nodes back; a reboot's gates hold nodes back
//! ([`crate::reboot_gate`]); one Operation at a time works on a node (a task whose node
//! another Operation holds waits, and says so); tasks whose turn came in Controlled mode
//! wait for approval; the others start, with their first controller steps written together
//! with the start ([`start_task`]).

use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;
use std::sync::Arc;

use bosun_api::node_task::{BlockReason, NodeTask, NodeTaskPhase};
use bosun_api::operation::{Operation, Plan};
use bosun_planner::Schedule;
use bosun_planner::state::TaskEvent;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use serde_json::json;

use super::{
    Context, RUNNING_TASKS_AT_ONCE, Recheck, Tasks, advance_running_task, apply_task_status,
    mirror_top, move_task, moved,
};
use bosun_cluster::events::Notice;

use crate::cache::Writes;
use crate::error::Result;
use crate::exclusion::Holder;
use crate::operation_gate::Hold;
use crate::time::set_condition;

/// What the start phase leaves for the summary.
pub(super) struct Started {
    /// The groups the operation gate held back.
    pub hold: Hold,
    /// One line per task waiting for a node another Operation holds.
    pub waiting: Vec<String>,
    /// One line per task a reboot gate holds.
    pub gated: Vec<String>,
    /// When the started tasks' first controller steps asked to be looked at again.
    pub recheck: Recheck,
}

/// Applies `decision` to the tasks. Ends the pass when the operation gate cannot decide yet
/// ([`crate::operation_gate::retry_later`]).
pub(super) async fn gate_and_start(
    ctx: &Context,
    op: &Operation,
    frozen: &Plan,
    tasks: &mut Tasks,
    decision: &Schedule,
    now: Timestamp,
) -> Result<ControlFlow<Action, Started>> {
    block_gone(ctx, tasks, &decision.invalidate).await?;
    // The operation gate before each task: a held node's task is not started.
    let hold = match crate::operation_gate::hold_nodes(
        ctx,
        op,
        frozen,
        tasks,
        &decision.start,
        &decision.await_approval,
    )
    .await
    {
        Ok(h) => h,
        Err(e) => return crate::operation_gate::retry_later(e).map(ControlFlow::Break),
    };
    // A reboot's gates before each node: a held node's task stays Pending, and says why.
    let gated = ask_reboot_gates(ctx, op, tasks, &decision.start, &hold).await;
    let gated_lines = note_gated(ctx, op, tasks, &gated, now).await?;
    let ungated;
    let decision = if gated.is_empty() {
        decision
    } else {
        let mut d = decision.clone();
        d.start.retain(|n| !gated.contains_key(n));
        ungated = d;
        &ungated
    };
    let (waiting, mut recheck) = start_unheld(ctx, op, tasks, decision, &hold, now).await?;
    if !gated.is_empty() {
        recheck.at_most(Some(crate::reboot_gate::RECHECK));
    }
    Ok(ControlFlow::Continue(Started {
        hold,
        waiting,
        gated: gated_lines,
        recheck,
    }))
}

/// Blocks (Invalid) the tasks of `nodes`, whose nodes left the cluster after the plan was
/// frozen.
async fn block_gone(ctx: &Context, tasks: &Tasks, nodes: &[String]) -> Result<()> {
    for node in nodes {
        move_task(
            ctx,
            &tasks[node],
            TaskEvent::NodeGone,
            Some((
                BlockReason::NodeGone,
                format!("node {node} left the cluster after the plan was frozen"),
            )),
        )
        .await?;
    }
    Ok(())
}

/// Writes on each task a reboot gate holds what holds it (and an Event when that is new or
/// changed); one line per held task for the summary.
async fn note_gated(
    ctx: &Context,
    op: &Operation,
    tasks: &Tasks,
    gated: &BTreeMap<String, crate::reboot_gate::Held>,
    now: Timestamp,
) -> Result<Vec<String>> {
    let mut lines = Vec::new();
    for (node, held) in gated {
        if note_waiting(
            ctx,
            &tasks[node],
            crate::reboot_gate::CONDITION,
            held.reason,
            &held.message,
            now,
        )
        .await?
        {
            tracing::info!(node = %node, reason = held.reason, message = %held.message, "reboot gate holds the node");
            ctx.events
                .publish(
                    op,
                    Notice::normal(REASON_GATE_HELD, ACTION_GATE, held.message.clone()),
                )
                .await;
        }
        lines.push(held.message.clone());
    }
    Ok(lines)
}

/// One Operation at a time per node: claims the nodes `decision` moves, notes on each task
/// whose node another Operation holds who holds it, and moves the others: to approval, or
/// started. The exclusion guard is held until the moves are written, so that no other
/// Operation's pass sees these nodes free meanwhile. Returns one line per waiting task, and
/// when the started tasks' first steps asked to be looked at again.
async fn start_unheld(
    ctx: &Context,
    op: &Operation,
    tasks: &mut Tasks,
    decision: &Schedule,
    hold: &Hold,
    now: Timestamp,
) -> Result<(Vec<String>, Recheck)> {
    let wanted = wanting_their_node(decision, tasks, hold);
    let exclusion_guard = if wanted.is_empty() {
        None
    } else {
        Some(ctx.exclusion.lock().await)
    };
    let held = claim(ctx, &op.name_any(), &wanted).await?;
    let mut waiting: Vec<String> = Vec::new();
    for node in wanted.iter().filter(|n| held.contains_key(n.as_str())) {
        let holder = &held[node.as_str()];
        note_held(ctx, &tasks[node], holder, now).await?;
        waiting.push(holder.message());
        tracing::info!(node = %node, holder = %holder.operation, task = %holder.task, phase = ?holder.phase, "node held by another Operation; task waits");
    }
    for node in free(&decision.await_approval, tasks, hold, &held) {
        move_task(
            ctx,
            &tasks[&node],
            TaskEvent::TurnCame {
                needs_approval: true,
            },
            None,
        )
        .await?;
    }
    let starting: BTreeSet<String> = free(&decision.start, tasks, hold, &held)
        .into_iter()
        .collect();
    let recheck = start_tasks(ctx, op, tasks, &starting).await?;
    drop(exclusion_guard);
    Ok((waiting, recheck))
}

/// The Event reason when a reboot gate holds a node (or what holds it changes).
pub const REASON_GATE_HELD: &str = "RebootHeld";
const ACTION_GATE: &str = "RebootGate";

/// The nodes of `starting` (Pending, or approved) that a reboot Operation's gates hold,
/// with what holds each. Empty for every other Operation, and for a reboot without gates.
async fn ask_reboot_gates(
    ctx: &Context,
    op: &Operation,
    tasks: &Tasks,
    starting: &[String],
    hold: &Hold,
) -> BTreeMap<String, crate::reboot_gate::Held> {
    let mut out = BTreeMap::new();
    let Some(spec) = op
        .spec
        .reboot
        .as_ref()
        .filter(|r| r.blocking_pod_selector.is_some() || r.alerts.is_some())
    else {
        return out;
    };
    for node in starting.iter().filter(|n| !hold.holds(&tasks[*n])) {
        if let Some(held) = crate::reboot_gate::check(&ctx.client, &ctx.gates, spec, node).await {
            out.insert(node.clone(), held);
        }
    }
    out
}

fn phase_of(tasks: &Tasks, node: &str) -> NodeTaskPhase {
    tasks[node]
        .status
        .as_ref()
        .map(|s| s.phase)
        .unwrap_or_default()
}

/// The nodes the scheduler would move (to approval or Running) whose group the gate lets
/// through and whose move needs the node to itself ([`crate::exclusion::needs_node`]).
fn wanting_their_node(decision: &Schedule, tasks: &Tasks, hold: &Hold) -> Vec<String> {
    decision
        .await_approval
        .iter()
        .chain(&decision.start)
        .filter(|n| !hold.holds(&tasks[*n]) && crate::exclusion::needs_node(phase_of(tasks, n)))
        .cloned()
        .collect()
}

/// Of `candidates`, those that may move now: not held back by the gate, and not waiting for
/// a node another Operation holds.
fn free(
    candidates: &[String],
    tasks: &Tasks,
    hold: &Hold,
    held: &BTreeMap<String, Holder>,
) -> Vec<String> {
    candidates
        .iter()
        .filter(|n| {
            let waits_for_holder =
                crate::exclusion::needs_node(phase_of(tasks, n)) && held.contains_key(n.as_str());
            !hold.holds(&tasks[*n]) && !waits_for_holder
        })
        .cloned()
        .collect()
}

/// Which of `wanted` other Operations hold, with their holders. This Operation is
/// registered as waiting for each before the holders are read (a holder that finishes
/// after the read wakes it: see `Waiters`), and forgotten for each that is free. The caller
/// holds [`Context::exclusion`].
async fn claim(
    ctx: &Context,
    operation: &str,
    wanted: &[String],
) -> Result<BTreeMap<String, Holder>> {
    for node in wanted {
        ctx.waiters.wait(node, operation);
    }
    let held = if wanted.is_empty() {
        BTreeMap::new()
    } else {
        held_nodes(ctx, operation).await?
    };
    for node in wanted.iter().filter(|n| !held.contains_key(n.as_str())) {
        ctx.waiters.forget(node, operation);
    }
    Ok(held)
}

/// Starts the tasks of `starting` (from Pending, or approved from AwaitingApproval), up to
/// `RUNNING_TASKS_AT_ONCE` at the same time, each with its first controller steps written
/// with the start ([`start_task`]).
async fn start_tasks(
    ctx: &Context,
    op: &Operation,
    tasks: &mut Tasks,
    starting: &BTreeSet<String>,
) -> Result<Recheck> {
    let starts: Vec<_> = tasks
        .iter_mut()
        .filter(|(node, _)| starting.contains(*node))
        .map(|(_, task)| {
            let from = task.status.as_ref().map(|s| s.phase).unwrap_or_default();
            let event = if from == NodeTaskPhase::AwaitingApproval {
                TaskEvent::Approved
            } else {
                TaskEvent::TurnCame {
                    needs_approval: false,
                }
            };
            start_task(ctx, op, Arc::make_mut(task), event)
        })
        .collect();
    let started: Vec<Option<std::time::Duration>> = futures::stream::iter(starts)
        .buffer_unordered(RUNNING_TASKS_AT_ONCE)
        .try_collect()
        .await?;
    let mut recheck = Recheck::default();
    for d in started {
        recheck.at_most(d);
    }
    Ok(recheck)
}

/// The nodes held by NodeTasks of Operations other than `operation`, of this instance.
/// The caller holds [`Context::exclusion`], and the last holder's writes must be seen: the
/// task store is read once it shows every write this controller made to other Operations'
/// tasks ([`crate::cache::Caches::tasks`]), so a holder this controller started or finished
/// is seen as it is now.
async fn held_nodes(ctx: &Context, operation: &str) -> Result<BTreeMap<String, Holder>> {
    let selector = bosun_cluster::instance_selector(ctx.instance.as_deref());
    let tasks = ctx
        .caches
        .tasks(&ctx.client, Writes::NotOf(operation), &selector, |_| true)
        .await?;
    Ok(crate::exclusion::holders(
        operation,
        tasks.iter().map(|t| &**t),
    ))
}

/// Says on a Pending task that its node is held by another Operation
/// ([`note_waiting`] with the `NodeHeld` condition).
pub(super) async fn note_held(
    ctx: &Context,
    task: &NodeTask,
    holder: &Holder,
    now: Timestamp,
) -> Result<()> {
    note_waiting(
        ctx,
        task,
        crate::exclusion::CONDITION,
        crate::exclusion::REASON_HELD,
        &holder.message(),
        now,
    )
    .await
    .map(|_| ())
}

/// Says on a Pending task what it waits for: `message` and a condition `type_` (True, with
/// `reason`), written only when they change (a write wakes this controller again). Returns
/// whether it wrote. Written with the controller's field manager and with this one
/// condition only, so a condition it set before for another wait goes (a task waits for
/// one thing at a time), and the write that starts the task removes this one.
pub(super) async fn note_waiting(
    ctx: &Context,
    task: &NodeTask,
    type_: &str,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> Result<bool> {
    let current = task.status.clone().unwrap_or_default();
    let mut conditions = current.conditions.clone();
    set_condition(
        &mut conditions,
        type_,
        true,
        reason,
        message,
        task.metadata.generation,
        now,
    );
    let condition = conditions.into_iter().find(|c| c.type_ == type_);
    let prior = current.conditions.iter().find(|c| c.type_ == type_);
    let others = current
        .conditions
        .iter()
        .any(|c| c.type_ != type_ && WAIT_CONDITIONS.contains(&c.type_.as_str()));
    if current.message.as_deref() == Some(message) && prior == condition.as_ref() && !others {
        return Ok(false);
    }
    let body = json!({ "phase": current.phase, "attempts": current.attempts, "message": message, "conditions": condition.into_iter().collect::<Vec<_>>() });
    apply_task_status(ctx, &task.name_any(), body, &ctx.manager).await?;
    Ok(true)
}

/// The conditions the controller sets on a Pending task for what it waits for.
const WAIT_CONDITIONS: [&str; 2] = [crate::exclusion::CONDITION, crate::reboot_gate::CONDITION];

/// Starts a task whose turn came (or that was approved): moves it to Running and runs the
/// controller steps that come first ([`advance_running_task`]), so that the start is
/// written together with its first controller step when that step is done in this pass.
/// Updates `task` in memory to what was written.
pub(super) async fn start_task(
    ctx: &Context,
    op: &Operation,
    task: &mut NodeTask,
    event: TaskEvent,
) -> Result<Option<std::time::Duration>> {
    let (next, body) = moved(task, event, None)?;
    // Only the controller's own manager can remove what it set before (the `NodeHeld`
    // condition and message of a task that waited for its node, a block reason): then the
    // start is written under it, alone, as every move is.
    let status = task.status.clone().unwrap_or_default();
    let owns_more = status.reason.is_some()
        || status
            .conditions
            .iter()
            .any(|c| WAIT_CONDITIONS.contains(&c.type_.as_str()));
    let carried = if owns_more {
        apply_task_status(ctx, &task.name_any(), body.clone(), &ctx.manager).await?;
        None
    } else {
        Some(body.clone())
    };
    mirror_top(task, next, &body);
    tracing::info!(node = %task.spec.node_name, group = %task.spec.group, "NodeTask started");
    if next != NodeTaskPhase::Running {
        // Not a start after all: nothing more to run.
        if let Some(body) = carried {
            apply_task_status(ctx, &task.name_any(), body, &ctx.manager).await?;
        }
        return Ok(None);
    }
    advance_running_task(ctx, op, task, carried).await
}
