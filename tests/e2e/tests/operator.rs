//! The operator end to end: the real `bosun-controller` binary and one real `bosun-agent`
//! process per simulated node, against the lab's real kube-apiserver, running the real
//! `hello` wasm plugin (signed with the e2e key, published through a ConfigMap).
//!
//! Each test runs its own controller and agents scoped to its own instance label (see
//! `bosun_e2e::Operator`), and holds `bosun_e2e::lock_lab_nodes` because the lab's nodes
//! (cordon state, host roots) are shared. The binaries are taken from the target
//! directory and refused when older than their sources: run
//! `cargo build -p bosun-controller -p bosun-agent` before `cargo test -p bosun-e2e --test lab operator::`
//! (`cargo test --workspace` builds them first).

use std::process::Command;

use anyhow::{Context, Result, ensure};
use bosun_api::node_task::{BlockReason, CheckStatus, NodeTask, NodeTaskPhase, StepPhase};
use bosun_api::operation::OperationPhase;
use bosun_e2e::Operator;
use bosun_lab::{LabHandle, Role};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::json;

/// (first step started, last step finished) of a task, from its step status.
fn interval(task: &NodeTask) -> Result<(Timestamp, Timestamp)> {
    let status = task.status.as_ref().context("task has no status")?;
    let start = status
        .steps
        .iter()
        .filter_map(|s| s.started_at.as_ref())
        .map(|t| t.0)
        .min();
    let end = status
        .steps
        .iter()
        .filter_map(|s| s.finished_at.as_ref())
        .map(|t| t.0)
        .max();
    Ok((
        start.context("no step started")?,
        end.context("no step finished")?,
    ))
}

/// The default lab's nodes: (control planes, workers).
fn roles(lab: &LabHandle) -> Result<(Vec<String>, Vec<String>)> {
    let cp = lab.names(Role::ControlPlane);
    let workers = lab.names(Role::Worker);
    ensure!(
        cp.len() == 1 && workers.len() == 3,
        "these tests expect the default lab (1 control plane, 3 workers), found {cp:?} and {workers:?}"
    );
    Ok((cp, workers))
}

/// CRDs, the hello plugin, and an operator for this test.
async fn setup(lab: &LabHandle, test: &str) -> Result<Operator> {
    bosun_e2e::apply_crds(&lab.client).await?;
    bosun_e2e::cluster::publish_hello(lab).await?;
    Operator::start(lab, test)
}

/// A custom Operation over 1 control-plane and 3 worker nodes with `maxUnavailable: 1`:
/// the control-plane node greets first; each worker is cordoned, greeted and uncordoned, one
/// at a time, in plan order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_operation_runs_to_succeeded_in_planned_order_with_max_unavailable_1() -> Result<()>
{
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let client = lab.client.clone();
    let (cp, workers) = roles(&lab)?;
    let mut operator = setup(&lab, "order").await?;

    let name = operator
        .create_operation("hello", json!({
            "custom": { "groups": [
                { "name": "control-plane",
                  "nodeSelector": { "matchExpressions": [{ "key": "node-role.kubernetes.io/control-plane", "operator": "Exists" }] },
                  "steps": [{ "name": "greet", "plugin": "hello", "action": "greet", "params": { "name": "e2e" } }] },
                { "name": "workers",
                  "steps": [
                      { "name": "cordon", "runsOn": "controller", "action": "cordon" },
                      { "name": "greet", "plugin": "hello", "action": "greet", "params": { "name": "e2e" } },
                      { "name": "uncordon", "runsOn": "controller", "action": "uncordon" } ] } ] },
            "rollout": { "maxUnavailable": 1 },
        }))
        .await?;
    let op = operator.wait_succeeded(&name).await?;
    let status = op.status.clone().unwrap_or_default();
    assert_eq!(status.progress.as_deref(), Some("4/4"));
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True"),
        "{:?}",
        status.conditions
    );

    // The frozen plan: the control-plane node alone, then the workers one at a time.
    let plan = status.plan.clone().context("no plan in status")?;
    let cp: Vec<&str> = cp.iter().map(String::as_str).collect();
    let workers: Vec<&str> = workers.iter().map(String::as_str).collect();
    let groups: Vec<(&str, Vec<&str>, u32)> = plan
        .groups
        .iter()
        .map(|g| {
            (
                g.name.as_str(),
                g.nodes.iter().map(String::as_str).collect(),
                g.max_parallel,
            )
        })
        .collect();
    let mut sorted_workers = workers.clone();
    sorted_workers.sort_unstable();
    assert_eq!(
        groups,
        vec![
            ("control-plane", cp.clone(), 1),
            ("workers", sorted_workers.clone(), 1)
        ]
    );

    let tasks = operator.tasks(&name).await?;
    assert_eq!(tasks.len(), 4, "one NodeTask per node: {:?}", tasks.keys());
    let kernel = String::from_utf8(Command::new("/usr/bin/uname").arg("-r").output()?.stdout)?
        .trim()
        .to_string();
    for node in &lab.nodes {
        let task = &tasks[&node.name];
        let owner = task
            .owner_references()
            .first()
            .context("NodeTask has no owner")?;
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.controller),
            ("Operation", name.as_str(), Some(true))
        );
        let ts = task.status.clone().unwrap_or_default();
        assert_eq!(
            ts.phase,
            NodeTaskPhase::Succeeded,
            "{}: {:?}",
            node.name,
            ts.message
        );
        assert!(
            ts.steps.iter().all(|s| s.phase == StepPhase::Succeeded),
            "{}: {:?}",
            node.name,
            ts.steps
        );
        // The plugin really ran against this node's own host root: each lab node has a
        // different distribution in its os-release.
        let greet = ts
            .steps
            .iter()
            .find(|s| s.name == "greet")
            .context("no greet step status")?;
        assert_eq!(greet.outputs.get("os"), Some(&node.os), "{}", node.name);
        assert_eq!(greet.outputs.get("kernel"), Some(&kernel), "{}", node.name);
        // The plugin's own check passed (the agent's built-in checks come with it).
        let own = greet
            .preflight
            .iter()
            .find(|c| c.name == "file-readable")
            .context("no file-readable check")?;
        assert_eq!(own.status, CheckStatus::Pass, "{own:?}");
        assert!(
            greet
                .preflight
                .iter()
                .all(|c| c.status != CheckStatus::Fail),
            "{:?}",
            greet.preflight
        );
        assert!(
            greet
                .log_tail
                .iter()
                .any(|l| l.contains("greeting the node as e2e")),
            "{:?}",
            greet.log_tail
        );
        assert_eq!(greet.changed, Some(false), "hello only reads");
    }

    // Order from the recorded step times: the control-plane task finished before any
    // worker task started; worker tasks never overlapped (maxUnavailable 1) and ran in plan
    // order.
    let (_, cp_end) = interval(&tasks[cp[0]])?;
    let mut previous_end = cp_end;
    for w in &sorted_workers {
        let (start, end) = interval(&tasks[*w])?;
        assert!(
            start >= previous_end,
            "{w} started at {start} before the previous task finished at {previous_end}"
        );
        assert!(end >= start);
        previous_end = end;
    }
    // The workers were cordoned during their turn and uncordoned after it.
    let nodes: Api<Node> = Api::all(client.clone());
    for w in &workers {
        let n = nodes.get(w).await?;
        assert_ne!(
            n.spec.and_then(|s| s.unschedulable),
            Some(true),
            "{w} was left cordoned"
        );
    }
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

/// An Operation whose step reads a missing file: its preflight fails, the task Blocks
/// (PreflightFailed) and so does the Operation, with the file name in its message and a
/// Blocked condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_preflight_blocks_the_task_and_the_operation_with_the_reason() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (cp, _) = roles(&lab)?;
    let mut operator = setup(&lab, "preflight").await?;

    let name = operator
        .create_operation("hello-missing", json!({ "custom": { "groups": [
            { "name": "control-plane",
              "nodeSelector": { "matchExpressions": [{ "key": "node-role.kubernetes.io/control-plane", "operator": "Exists" }] },
              "steps": [{ "name": "greet", "plugin": "hello", "action": "greet", "params": { "file": "/etc/bosun-e2e-missing" } }] } ] } }))
        .await?;
    let op = operator.wait_settled(&name).await?;
    let status = op.status.clone().unwrap_or_default();
    assert_eq!(
        status.phase,
        OperationPhase::Blocked,
        "{:?}",
        status.message
    );
    let message = status.message.clone().unwrap_or_default();
    assert!(
        message.contains("preflight failed") && message.contains("/etc/bosun-e2e-missing"),
        "{message}"
    );
    let blocked = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Blocked")
        .context("no Blocked condition")?;
    assert_eq!(
        (blocked.status.as_str(), blocked.reason.as_str()),
        ("True", "PreflightFailed")
    );
    let tasks = operator.tasks(&name).await?;
    let ts = tasks[&cp[0]].status.clone().unwrap_or_default();
    assert_eq!(
        (ts.phase, ts.reason),
        (NodeTaskPhase::Blocked, Some(BlockReason::PreflightFailed))
    );
    let greet = &ts.steps[0];
    assert_eq!(greet.phase, StepPhase::Failed);
    let own = greet
        .preflight
        .iter()
        .find(|c| c.name == "file-readable")
        .context("no file-readable check")?;
    assert_eq!(own.status, CheckStatus::Fail, "{own:?}");
    assert_eq!(
        greet.error.as_ref().map(|e| e.code.as_str()),
        Some("preflight-failed")
    );

    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}
