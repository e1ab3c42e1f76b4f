//! One Operation at a time per node, end to end: two Operations of one instance over the
//! same lab node with the real controller, agents and `hello` plugin. While the first
//! Operation's task holds the node (Blocked by a failing step, or AwaitingApproval in
//! Controlled mode), the second Operation's task stays Pending with a message and a
//! `NodeHeld` condition naming the holder, and its step never starts; once the first is
//! resolved (skipped, or approved and finished), the second runs to Succeeded.
//!
//! Each test runs its own controller and agents (instance-scoped) and holds
//! `bosun_e2e::lock_lab_nodes` (the lab's nodes are shared), and deletes its Operations at
//! the end, Blocked ones included. Build the binaries first:
//! `cargo build -p bosun-controller -p bosun-agent`.

use anyhow::{Context, Result, ensure};
use bosun_api::node_task::{NodeTask, NodeTaskPhase, StepPhase};
use bosun_api::operation::{Operation, OperationPhase};
use bosun_e2e::Operator;
use bosun_lab::{LabHandle, Role};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams};
use serde_json::json;

/// The condition the controller sets while a node is held by another Operation.
const NODE_HELD: &str = "NodeHeld";

/// A custom Operation greeting only `node`; `file` makes the hello plugin's preflight read
/// it (a missing file fails the step).
fn greet_on(node: &str, file: Option<&str>, mode: &str) -> serde_json::Value {
    let mut params = json!({ "name": "exclusion" });
    if let Some(f) = file {
        params["file"] = json!(f);
    }
    json!({
        "executionMode": mode,
        "custom": { "groups": [{
            "name": "one",
            "nodeSelector": { "matchExpressions": [{ "key": "kubernetes.io/hostname", "operator": "In", "values": [node] }] },
            "steps": [{ "name": "greet", "plugin": "hello", "action": "greet", "params": params }],
        }] },
    })
}

fn first_worker(lab: &LabHandle) -> Result<String> {
    lab.nodes
        .iter()
        .find(|n| n.role == Role::Worker)
        .map(|n| n.name.clone())
        .context("the lab has no worker node")
}

fn held(task: &NodeTask) -> Option<String> {
    let status = task.status.as_ref()?;
    status
        .conditions
        .iter()
        .find(|c| c.type_ == NODE_HELD && c.status == "True")?;
    status.message.clone()
}

/// Deletes the test's Operations (their NodeTasks go with them), whatever their phase.
async fn clean_up(operator: &Operator, names: &[&str]) {
    let ops: Api<Operation> = Api::all(operator.client.clone());
    for name in names {
        if let Err(e) = ops.delete(name, &DeleteParams::background()).await {
            eprintln!("cleaning up Operation {name}: {e}");
        }
    }
}

/// The waiting side: the second Operation's task stays Pending with the holder named in
/// its message and condition and in the Operation's status, and has run no step.
async fn assert_waits(operator: &mut Operator, second: &str, node: &str, want: &str) -> Result<()> {
    let task = operator
        .wait_task(second, node, "waiting for the node, saying so", |t| {
            held(t).as_deref() == Some(want)
        })
        .await?;
    let status = task.status.clone().unwrap_or_default();
    ensure!(
        status.phase == NodeTaskPhase::Pending,
        "the waiting task is {:?}",
        status.phase
    );
    ensure!(
        status.steps.is_empty(),
        "the waiting task ran a step: {:?}",
        status.steps
    );
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == NODE_HELD)
        .context("no NodeHeld condition")?;
    ensure!(
        condition.reason == "HeldByOtherOperation" && condition.message == want,
        "{condition:?}"
    );
    let op = operator
        .wait_operation(second, "NodeHeld condition on the Operation", |o| {
            o.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == NODE_HELD && c.status == "True")
            })
        })
        .await?;
    let status = op.status.clone().unwrap_or_default();
    ensure!(
        status.message.as_deref().is_some_and(|m| m.contains(want)),
        "the Operation's message names the holder: {:?}",
        status.message
    );
    ensure!(
        status.phase == OperationPhase::Running,
        "the waiting Operation is {:?}",
        status.phase
    );
    Ok(())
}

/// The waiting side after the release: the second Operation runs to Succeeded, its step
/// started after the holder let go (`released_after`), and the conditions say nothing is
/// held any more.
async fn assert_proceeds(
    operator: &mut Operator,
    second: &str,
    node: &str,
    released_after: k8s_openapi::jiff::Timestamp,
) -> Result<()> {
    let op = operator.wait_settled(second).await?;
    let status = op.status.clone().unwrap_or_default();
    ensure!(
        status.phase == OperationPhase::Succeeded,
        "the second Operation ended {:?}: {:?}",
        status.phase,
        status.message
    );
    let held_condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == NODE_HELD)
        .context("no NodeHeld condition on the Operation")?;
    ensure!(
        held_condition.status == "False" && held_condition.reason == "NoNodeHeld",
        "{held_condition:?}"
    );
    let task = operator.task(second, node).await?;
    let ts = task.status.clone().unwrap_or_default();
    ensure!(ts.phase == NodeTaskPhase::Succeeded, "{:?}", ts.message);
    ensure!(
        !ts.conditions.iter().any(|c| c.type_ == NODE_HELD),
        "the started task still carries NodeHeld: {:?}",
        ts.conditions
    );
    let greet = ts
        .steps
        .iter()
        .find(|s| s.name == "greet")
        .context("no greet step status")?;
    ensure!(greet.phase == StepPhase::Succeeded, "{greet:?}");
    let started = greet
        .started_at
        .as_ref()
        .context("greet has no start time")?
        .0;
    ensure!(
        started >= released_after,
        "the second Operation's step started at {started}, before the node was released at {released_after}"
    );
    Ok(())
}

/// A Blocked task holds its node: the second Operation waits until a person skips the
/// blocked task, then runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_task_holds_its_node_until_it_is_skipped_then_the_other_operation_runs()
-> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    bosun_e2e::apply_crds(&lab.client).await?;
    bosun_e2e::cluster::publish_hello(&lab).await?;
    let mut operator = Operator::start(&lab, "excl-blocked")?;
    let node = first_worker(&lab)?;

    let first = operator
        .create_operation(
            "excl-first",
            greet_on(&node, Some("/etc/bosun-e2e-exclusion-missing"), "Auto"),
        )
        .await?;
    let result: Result<()> = async {
        let blocked = operator
            .wait_task(&first, &node, "Blocked by its failing step", |t| {
                t.status
                    .as_ref()
                    .is_some_and(|s| s.phase == NodeTaskPhase::Blocked)
            })
            .await?;
        let second = operator
            .create_operation("excl-second", greet_on(&node, None, "Auto"))
            .await?;
        let r: Result<()> = async {
            let want = format!(
                "waiting: node {node} is held by Operation {first} (task {}, Blocked)",
                blocked.name_any()
            );
            assert_waits(&mut operator, &second, &node, &want).await?;

            // A person gives up on the first Operation's node: the node is released.
            // (The lab, agents and this test share one machine clock.)
            let released = k8s_openapi::jiff::Timestamp::now();
            operator
                .patch_task_spec(&blocked.name_any(), json!({ "recovery": "Skip" }))
                .await?;
            operator
                .wait_task(&first, &node, "Skipped", |t| {
                    t.status
                        .as_ref()
                        .is_some_and(|s| s.phase == NodeTaskPhase::Skipped)
                })
                .await?;
            assert_proceeds(&mut operator, &second, &node, released).await
        }
        .await;
        clean_up(&operator, &[&second]).await;
        r
    }
    .await;
    clean_up(&operator, &[&first]).await;
    result?;
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

/// A task awaiting approval (Controlled mode) holds its node: the second Operation waits
/// until the first task is approved and has finished, then runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_awaiting_approval_holds_its_node_until_it_is_approved_and_done() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    bosun_e2e::apply_crds(&lab.client).await?;
    bosun_e2e::cluster::publish_hello(&lab).await?;
    let mut operator = Operator::start(&lab, "excl-approval")?;
    let node = first_worker(&lab)?;

    let first = operator
        .create_operation("excl-controlled", greet_on(&node, None, "Controlled"))
        .await?;
    let result: Result<()> = async {
        let waiting = operator
            .wait_task(&first, &node, "AwaitingApproval", |t| {
                t.status
                    .as_ref()
                    .is_some_and(|s| s.phase == NodeTaskPhase::AwaitingApproval)
            })
            .await?;
        let second = operator
            .create_operation("excl-auto", greet_on(&node, None, "Auto"))
            .await?;
        let r: Result<()> = async {
            let want = format!(
                "waiting: node {node} is held by Operation {first} (task {}, AwaitingApproval)",
                waiting.name_any()
            );
            assert_waits(&mut operator, &second, &node, &want).await?;

            operator
                .patch_task_spec(&waiting.name_any(), json!({ "approve": true }))
                .await?;
            let op = operator.wait_settled(&first).await?;
            ensure!(
                phase(&op) == OperationPhase::Succeeded,
                "the approved Operation ended {:?}",
                phase(&op)
            );
            let done = operator.task(&first, &node).await?;
            let finished = done
                .status
                .as_ref()
                .and_then(|s| s.steps.first())
                .and_then(|s| s.finished_at.clone())
                .context("no finish time")?
                .0;
            assert_proceeds(&mut operator, &second, &node, finished).await
        }
        .await;
        clean_up(&operator, &[&second]).await;
        r
    }
    .await;
    clean_up(&operator, &[&first]).await;
    result?;
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

fn phase(op: &Operation) -> OperationPhase {
    op.status.as_ref().map(|s| s.phase).unwrap_or_default()
}
