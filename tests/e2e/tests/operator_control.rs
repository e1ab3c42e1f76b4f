//! The operator's controls end to end, against the lab: a person's recovery (retry after
//! fixing the cause, skip), Controlled mode's approvals, DryRun, pause and resume, and what
//! happens when the controller or an agent is killed mid-Operation.
//!
//! Every test runs its own real `bosun-controller` and one real `bosun-agent` per lab node,
//! scoped to its own instance (`bosun_e2e::Operator`), and holds `bosun_e2e::lock_lab_nodes`
//! (the nodes' cordon state and host roots are shared). The steps come from the `e2e-steps`
//! test plugin (plugins/testing/steps: sleep, sleep-once, require, write) and the `hello`
//! example plugin. People's decisions are made as `kubectl` would: a merge patch of the
//! NodeTask's `spec.approve` / `spec.recovery` or the Operation's `spec.paused`.
//!
//! No assertion is about how long something took: order is proven from the microsecond
//! step times the controller and agents record, compared with the moment the test acted.
//! The long steps (5 to 8 s) only have to outlast the test's reaction to seeing them
//! Running (one poll, one API call) on a loaded machine.
//!
//! Build the binaries first: `cargo build -p bosun-controller -p bosun-agent`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bosun_api::node_task::{BlockReason, NodeTask, NodeTaskPhase, Recovery, StepPhase, StepStatus};
use bosun_api::operation::OperationPhase;
use bosun_e2e::Operator;
use bosun_e2e::operator::{agent_name, hash_tree, phase_of};
use bosun_lab::{LabHandle, Role};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::json;

/// The directory `e2e-steps` writes in, inside each host root (granted read-write).
const STATE_DIR: &str = "/var/lib/bosun-e2e";

struct Lab {
    lab: LabHandle,
    cp: String,
    workers: Vec<String>,
}

impl Lab {
    fn root(&self, node: &str) -> PathBuf {
        self.lab
            .nodes
            .iter()
            .find(|n| n.name == node)
            .map(|n| n.host_root.clone())
            .expect("a lab node")
    }

    /// `STATE_DIR/<name>` in `node`'s host root, as the test (not the plugin) sees it.
    fn state_file(&self, node: &str, name: &str) -> PathBuf {
        self.root(node)
            .join(STATE_DIR.trim_start_matches('/'))
            .join(name)
    }
}

/// The lab (default shape: 1 control plane, 3 workers), CRDs, both plugins published,
/// `STATE_DIR` present in every host root, and an operator for this test.
async fn setup(test: &str) -> Result<(Lab, Operator)> {
    let lab = bosun_lab::ensure_lab().await?;
    let cp = lab.names(Role::ControlPlane);
    let mut workers = lab.names(Role::Worker);
    workers.sort();
    ensure!(
        cp.len() == 1 && workers.len() == 3,
        "these tests expect the default lab (1 control plane, 3 workers), found {cp:?} and {workers:?}"
    );
    bosun_e2e::apply_crds(&lab.client).await?;
    bosun_e2e::cluster::publish_hello(&lab).await?;
    bosun_e2e::publish_test_steps(&lab.client, STATE_DIR).await?;
    for node in &lab.nodes {
        std::fs::create_dir_all(node.host_root.join(STATE_DIR.trim_start_matches('/')))?;
    }
    let operator = Operator::start(&lab, test)?;
    Ok((
        Lab {
            cp: cp[0].clone(),
            workers,
            lab,
        },
        operator,
    ))
}

/// The custom-group selector of the control-plane node.
fn control_plane() -> serde_json::Value {
    json!({ "matchExpressions": [{ "key": "node-role.kubernetes.io/control-plane", "operator": "Exists" }] })
}

/// An `e2e-steps` step.
fn step(name: &str, action: &str, params: serde_json::Value) -> serde_json::Value {
    json!({ "name": name, "plugin": "e2e-steps", "action": action, "params": params })
}

fn step_of<'a>(task: &'a NodeTask, name: &str) -> Option<&'a StepStatus> {
    task.status
        .as_ref()
        .and_then(|s| s.steps.iter().find(|x| x.name == name))
}

fn step_phase(task: &NodeTask, name: &str) -> StepPhase {
    step_of(task, name).map_or(StepPhase::Pending, |s| s.phase)
}

fn task_phase(task: &NodeTask) -> NodeTaskPhase {
    task.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

fn started(task: &NodeTask, name: &str) -> Result<Timestamp> {
    step_of(task, name)
        .and_then(|s| s.started_at.as_ref())
        .map(|t| t.0)
        .with_context(|| format!("{}: step {name} never started", task.name_any()))
}

/// Waits until the controller acted on the `recovery` set on `node`'s task (cleared it, and
/// the task left Blocked) and the Operation left Blocked, then until it settles again.
async fn settle_after_recovery(
    operator: &mut Operator,
    op: &str,
    node: &str,
) -> Result<bosun_api::operation::Operation> {
    operator
        .wait_task(op, node, "recovery acted on", |t| {
            t.spec.recovery.is_none() && task_phase(t) != NodeTaskPhase::Blocked
        })
        .await?;
    operator
        .wait_operation(op, "no longer Blocked", |o| {
            phase_of(o) != OperationPhase::Blocked
        })
        .await?;
    operator.wait_settled(op).await
}

/// True when no step of the task has started (no status entry with a start time).
fn nothing_started(task: &NodeTask) -> bool {
    task.status
        .as_ref()
        .is_none_or(|s| s.steps.iter().all(|x| x.started_at.is_none()))
}

/// A step fails (retryable) because a file is missing: the task and the Operation Block
/// with the reason. The test creates the file (fixes the cause) and sets
/// `recovery: Retry`: the same step runs again (attempt 2), the task runs again (attempt
/// 2), the controller clears `recovery`, and the Operation succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_step_blocks_then_retry_after_fixing_the_cause_succeeds() -> Result<()> {
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (lab, mut operator) = setup("retry").await?;
    let marker = bosun_e2e::unique("ready");
    let path = format!("{STATE_DIR}/{marker}");
    let op = operator
        .create_operation(
            "retry",
            json!({ "custom": { "groups": [{ "name": "control-plane", "nodeSelector": control_plane(),
                "steps": [ step("check", "require", json!({ "path": path })), step("after", "sleep", json!({ "millis": 1 })) ] }] } }),
        )
        .await?;

    let blocked = operator.wait_settled(&op).await?;
    let status = blocked.status.clone().unwrap_or_default();
    assert_eq!(
        status.phase,
        OperationPhase::Blocked,
        "{:?}",
        status.message
    );
    assert!(
        status
            .message
            .as_deref()
            .unwrap_or("")
            .contains("does not exist yet"),
        "{:?}",
        status.message
    );
    let task = operator.task(&op, &lab.cp).await?;
    let ts = task.status.clone().unwrap_or_default();
    assert_eq!(
        (ts.phase, ts.reason, ts.attempts),
        (NodeTaskPhase::Blocked, Some(BlockReason::StepFailed), 1)
    );
    let check = step_of(&task, "check").context("no check step status")?;
    assert_eq!((check.phase, check.attempts), (StepPhase::Failed, 1));
    assert_eq!(
        check.error.as_ref().map(|e| (e.code.as_str(), e.retryable)),
        Some(("missing", true))
    );
    assert_eq!(
        step_phase(&task, "after"),
        StepPhase::Pending,
        "nothing runs after a failed step"
    );

    // Fix the cause, then ask for a retry.
    std::fs::write(lab.state_file(&lab.cp, &marker), "ok\n")?;
    let asked = Timestamp::now();
    operator
        .patch_task_spec(&task.name_any(), json!({ "recovery": "Retry" }))
        .await?;
    let done = settle_after_recovery(&mut operator, &op, &lab.cp).await?;
    assert_eq!(
        phase_of(&done),
        OperationPhase::Succeeded,
        "{:?}\n{}",
        done.status.and_then(|s| s.message),
        bosun_e2e::describe_tasks(&operator.client, &op).await
    );

    let task = operator.task(&op, &lab.cp).await?;
    let ts = task.status.clone().unwrap_or_default();
    assert_eq!(
        (ts.phase, ts.attempts, ts.reason),
        (NodeTaskPhase::Succeeded, 2, None)
    );
    assert_eq!(
        task.spec.recovery, None,
        "the controller clears recovery once it acted"
    );
    let check = step_of(&task, "check").context("no check step status")?;
    assert_eq!((check.phase, check.attempts), (StepPhase::Succeeded, 2));
    assert!(
        check.error.is_none(),
        "the old error is gone: {:?}",
        check.error
    );
    assert!(
        started(&task, "check")? >= asked,
        "the retry ran after it was asked for"
    );
    assert_eq!(
        check.outputs.get("resumed").map(String::as_str),
        Some("false"),
        "a retry after a recorded failure does not resume an interrupted attempt"
    );
    assert_eq!(
        step_of(&task, "after").map(|s| (s.phase, s.attempts)),
        Some((StepPhase::Succeeded, 1))
    );
    std::fs::remove_file(lab.state_file(&lab.cp, &marker))?;
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

/// The control-plane node's step fails and blocks the Operation; nothing in the next group
/// starts while it is blocked. `recovery: Skip` leaves that node (task and step Skipped,
/// the step after it never runs) and the Operation moves on to the workers and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_leaves_the_blocked_node_and_the_operation_moves_on() -> Result<()> {
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (lab, mut operator) = setup("skip").await?;
    let missing = format!("{STATE_DIR}/{}", bosun_e2e::unique("never"));
    let op = operator
        .create_operation(
            "skip",
            json!({ "custom": { "groups": [
                { "name": "control-plane", "nodeSelector": control_plane(),
                  "steps": [ step("check", "require", json!({ "path": missing })), step("after", "sleep", json!({ "millis": 1 })) ] },
                { "name": "workers", "steps": [ step("nap", "sleep", json!({ "millis": 1 })) ] } ] },
              "rollout": { "maxUnavailable": 3 } }),
        )
        .await?;
    let blocked = operator.wait_settled(&op).await?;
    assert_eq!(phase_of(&blocked), OperationPhase::Blocked);
    let tasks = operator.tasks(&op).await?;
    for w in &lab.workers {
        assert!(
            task_phase(&tasks[w]) == NodeTaskPhase::Pending && nothing_started(&tasks[w]),
            "{w} started while the Operation was blocked"
        );
    }

    let skipped_at = Timestamp::now();
    operator
        .patch_task_spec(&tasks[&lab.cp].name_any(), json!({ "recovery": "Skip" }))
        .await?;
    let done = settle_after_recovery(&mut operator, &op, &lab.cp).await?;
    let status = done.status.clone().unwrap_or_default();
    assert_eq!(
        status.phase,
        OperationPhase::Succeeded,
        "{:?}",
        status.message
    );
    assert_eq!(
        (
            status.counts.skipped,
            status.counts.succeeded,
            status.progress.as_deref()
        ),
        (1, 3, Some("4/4"))
    );

    let tasks = operator.tasks(&op).await?;
    let cp = &tasks[&lab.cp];
    assert_eq!(task_phase(cp), NodeTaskPhase::Skipped);
    assert_eq!(cp.spec.recovery, None);
    assert!(
        cp.status
            .as_ref()
            .and_then(|s| s.message.as_deref())
            .unwrap_or("")
            .contains("recovery Skip"),
        "{:?}",
        cp.status
    );
    assert_eq!(step_phase(cp, "check"), StepPhase::Skipped);
    assert!(
        step_of(cp, "after").is_none_or(|s| s.started_at.is_none()),
        "the step after a skipped one never runs"
    );
    for w in &lab.workers {
        assert_eq!(task_phase(&tasks[w]), NodeTaskPhase::Succeeded, "{w}");
        assert!(
            started(&tasks[w], "nap")? >= skipped_at,
            "{w} started before the skip"
        );
    }
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

/// Controlled mode: each NodeTask waits in AwaitingApproval, with no step started, until
/// its `spec.approve`; each one's first step starts only after the test approved it. The
/// rollout still goes one node at a time (control plane, then workers with
/// `maxUnavailable: 1`), so only the task whose turn it is asks for approval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controlled_mode_starts_each_task_only_after_its_approval() -> Result<()> {
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (lab, mut operator) = setup("controlled").await?;
    let op = operator
        .create_operation(
            "controlled",
            json!({ "executionMode": "Controlled", "rollout": { "maxUnavailable": 1 }, "custom": { "groups": [
                { "name": "control-plane", "nodeSelector": control_plane(), "steps": [ step("nap", "sleep", json!({ "millis": 1 })) ] },
                { "name": "workers", "steps": [ step("nap", "sleep", json!({ "millis": 1 })) ] } ] } }),
        )
        .await?;
    let mut order = vec![lab.cp.clone()];
    order.extend(lab.workers.iter().cloned());
    for (i, node) in order.iter().enumerate() {
        operator
            .wait_task(&op, node, "AwaitingApproval", |t| {
                task_phase(t) == NodeTaskPhase::AwaitingApproval
            })
            .await?;
        let waiting = operator
            .wait_operation(&op, "AwaitingApproval", |o| {
                phase_of(o) == OperationPhase::AwaitingApproval
            })
            .await?;
        assert!(
            waiting
                .status
                .and_then(|s| s.message)
                .unwrap_or_default()
                .contains(node.as_str())
        );
        let tasks = operator.tasks(&op).await?;
        for (n, t) in &tasks {
            let done_before = order[..i].contains(n);
            if !done_before {
                assert!(
                    nothing_started(t),
                    "{n} started a step before its approval: {:?}",
                    t.status
                );
            }
            if !done_before && n != node {
                assert_eq!(
                    task_phase(t),
                    NodeTaskPhase::Pending,
                    "{n}: only the task whose turn it is waits for approval"
                );
            }
        }
        let approved = Timestamp::now();
        operator
            .patch_task_spec(&tasks[node].name_any(), json!({ "approve": true }))
            .await?;
        let t = operator
            .wait_task(&op, node, "Succeeded", |t| {
                task_phase(t) == NodeTaskPhase::Succeeded
            })
            .await?;
        assert!(
            started(&t, "nap")? >= approved,
            "{node} started before it was approved"
        );
    }
    let done = operator.wait_settled(&op).await?;
    assert_eq!(phase_of(&done), OperationPhase::Succeeded);
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

/// DryRun over every node with steps that would change the host (write a file, write a
/// marker after a wait), a read-only step, and cordon/uncordon: every host root is
/// byte-for-byte what it was (every file hashed before and after), no node was left
/// cordoned, and each step reports what it would have changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_leaves_every_host_root_byte_for_byte_unchanged() -> Result<()> {
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (lab, mut operator) = setup("dryrun").await?;
    let name = bosun_e2e::unique("dry");
    let before: BTreeMap<String, _> = lab
        .lab
        .nodes
        .iter()
        .map(|n| Ok((n.name.clone(), hash_tree(&n.host_root)?)))
        .collect::<Result<_>>()?;
    let steps = json!([
        { "name": "cordon", "runsOn": "controller", "action": "cordon" },
        step("write", "write", json!({ "name": name, "content": "changed by a dry run?\n" })),
        step("marker", "sleep-once", json!({ "millis": 1, "marker": format!("{name}.marker") })),
        { "name": "greet", "plugin": "hello", "action": "greet", "params": { "name": "dry-run" } },
        { "name": "uncordon", "runsOn": "controller", "action": "uncordon" },
    ]);
    let op = operator
        .create_operation(
            "dryrun",
            json!({ "executionMode": "DryRun", "rollout": { "maxUnavailable": 3 }, "custom": { "groups": [
                { "name": "control-plane", "nodeSelector": control_plane(), "steps": steps },
                { "name": "workers", "steps": steps } ] } }),
        )
        .await?;
    let done = operator.wait_settled(&op).await?;
    assert_eq!(
        phase_of(&done),
        OperationPhase::Succeeded,
        "{:?}\n{}",
        done.status.and_then(|s| s.message),
        bosun_e2e::describe_tasks(&operator.client, &op).await
    );

    for node in &lab.lab.nodes {
        let after = hash_tree(&node.host_root)?;
        let was = &before[&node.name];
        let changed: Vec<_> = after
            .iter()
            .filter(|(p, h)| was.get(*p) != Some(h))
            .map(|(p, _)| p.clone())
            .collect();
        let removed: Vec<_> = was
            .keys()
            .filter(|p| !after.contains_key(*p))
            .cloned()
            .collect();
        assert!(
            changed.is_empty() && removed.is_empty(),
            "{}: dry run changed {changed:?}, removed {removed:?}",
            node.name
        );
    }
    let tasks = operator.tasks(&op).await?;
    assert_eq!(tasks.len(), 4);
    let nodes: Api<Node> = Api::all(operator.client.clone());
    for (node, task) in &tasks {
        assert!(task.spec.dry_run, "{node}");
        let write = step_of(task, "write").context("no write status")?;
        assert_eq!(
            (write.phase, write.changed),
            (StepPhase::Succeeded, Some(false)),
            "{node}"
        );
        let file = format!("{STATE_DIR}/{name}");
        assert!(
            write
                .message
                .as_deref()
                .unwrap_or("")
                .starts_with(&format!("would write 22 bytes to {file}")),
            "{node}: {:?}",
            write.message
        );
        assert_eq!(write.outputs.get("wouldWrite"), Some(&file));
        let marker = step_of(task, "marker").context("no marker status")?;
        assert!(
            marker
                .message
                .as_deref()
                .unwrap_or("")
                .starts_with("would write"),
            "{node}: {:?}",
            marker.message
        );
        let cordon = step_of(task, "cordon").context("no cordon status")?;
        assert_eq!(
            cordon.message.as_deref(),
            Some(format!("dry run: would cordon node {node}").as_str())
        );
        assert_eq!(cordon.changed, Some(false));
        let n = nodes.get(node).await?;
        assert_ne!(
            n.spec.and_then(|s| s.unschedulable),
            Some(true),
            "{node} cordoned by a dry run"
        );
        assert!(!lab.state_file(node, &name).exists());
    }
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

/// Pausing while a long step runs: that step finishes, the next step of the same task and
/// the next group do not start while paused (the Operation shows Paused), and after
/// `paused: false` everything left starts (after the resume, by its recorded start time)
/// and the Operation succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_mid_run_lets_the_running_step_finish_and_starts_nothing_until_resume() -> Result<()>
{
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (lab, mut operator) = setup("pause").await?;
    let op = operator
        .create_operation(
            "pause",
            json!({ "rollout": { "maxUnavailable": 3 }, "custom": { "groups": [
                { "name": "control-plane", "nodeSelector": control_plane(),
                  "steps": [ step("long", "sleep", json!({ "millis": 6000 })), step("next", "sleep", json!({ "millis": 1 })) ] },
                { "name": "workers", "steps": [ step("nap", "sleep", json!({ "millis": 1 })) ] } ] } }),
        )
        .await?;
    operator
        .wait_task(&op, &lab.cp, "step long Running", |t| {
            step_phase(t, "long") == StepPhase::Running
        })
        .await?;
    operator
        .patch_operation_spec(&op, json!({ "paused": true }))
        .await?;
    let paused = Timestamp::now();
    operator
        .wait_operation(&op, "Paused", |o| phase_of(o) == OperationPhase::Paused)
        .await?;
    let t = operator
        .wait_task(&op, &lab.cp, "step long Succeeded", |t| {
            step_phase(t, "long") == StepPhase::Succeeded
        })
        .await?;
    let long = step_of(&t, "long").context("no long status")?;
    assert!(
        long.started_at.as_ref().is_some_and(|s| s.0 < paused),
        "the long step was running when paused"
    );
    assert!(
        long.finished_at.as_ref().is_some_and(|f| f.0 > paused),
        "the running step finished after the pause"
    );
    // The agent has decided about the next step once it logs that the step waits (a next
    // step started despite the pause would show in the recorded phases below).
    let agent_log = operator.procs.log_of(&agent_name(&lab.cp));
    let waiting = |text: &str| {
        text.lines()
            .any(|l| l.contains("step waits: the Operation is paused") && l.contains("step=next"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let text = std::fs::read_to_string(&agent_log).unwrap_or_default();
        if waiting(&text) {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "the agent of {} did not log within 60 s that step next waits for the pause \
             (its log: {}); the last lines:\n{}",
            lab.cp,
            agent_log.display(),
            text.lines().rev().take(15).collect::<Vec<_>>().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let tasks = operator.tasks(&op).await?;
    assert_eq!(
        step_phase(&tasks[&lab.cp], "next"),
        StepPhase::Pending,
        "a new step started while paused"
    );
    for w in &lab.workers {
        assert!(nothing_started(&tasks[w]), "{w} started while paused");
    }
    assert_eq!(
        phase_of(
            &operator
                .wait_operation(&op, "still Paused", |_| true)
                .await?
        ),
        OperationPhase::Paused
    );

    let resumed = Timestamp::now();
    operator
        .patch_operation_spec(&op, json!({ "paused": false }))
        .await?;
    let done = operator.wait_settled(&op).await?;
    assert_eq!(phase_of(&done), OperationPhase::Succeeded);
    let tasks = operator.tasks(&op).await?;
    assert!(
        started(&tasks[&lab.cp], "next")? >= resumed,
        "next started before the resume"
    );
    for w in &lab.workers {
        assert!(
            started(&tasks[w], "nap")? >= resumed,
            "{w} started before the resume"
        );
    }
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

/// The controller is SIGKILLed while a worker's long step runs and started again: the
/// Operation completes, exactly one NodeTask per node exists, every step and every task ran
/// exactly once (attempts 1), the steps of a task never overlap, and the workers
/// (`maxUnavailable: 1`) never overlap either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_killed_mid_operation_and_restarted_completes_with_no_step_run_twice()
-> Result<()> {
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (lab, mut operator) = setup("ctlkill").await?;
    let op = operator
        .create_operation(
            "ctlkill",
            json!({ "rollout": { "maxUnavailable": 1 }, "custom": { "groups": [
                { "name": "control-plane", "nodeSelector": control_plane(), "steps": [ step("nap", "sleep", json!({ "millis": 500 })) ] },
                { "name": "workers", "steps": [
                    { "name": "cordon", "runsOn": "controller", "action": "cordon" },
                    step("long", "sleep", json!({ "millis": 5000 })),
                    { "name": "uncordon", "runsOn": "controller", "action": "uncordon" } ] } ] } }),
        )
        .await?;
    let first = &lab.workers[0];
    operator
        .wait_task(&op, first, "step long Running", |t| {
            step_phase(t, "long") == StepPhase::Running
        })
        .await?;
    operator.kill("controller")?;
    // The agent finishes its step with no controller; nothing else can move.
    let t = operator
        .wait_task(&op, first, "step long Succeeded", |t| {
            step_phase(t, "long") == StepPhase::Succeeded
        })
        .await?;
    assert_eq!(
        step_of(&t, "long").and_then(|s| s.outputs.get("resumed").cloned()),
        Some("false".to_owned()),
        "a controller restart interrupts no agent step"
    );
    assert_eq!(
        step_phase(&t, "uncordon"),
        StepPhase::Pending,
        "no controller, no controller step"
    );
    operator.start_controller()?;
    let done = operator.wait_settled(&op).await?;
    assert_eq!(
        phase_of(&done),
        OperationPhase::Succeeded,
        "{}",
        bosun_e2e::describe_tasks(&operator.client, &op).await
    );

    let tasks = operator.tasks(&op).await?;
    assert_eq!(tasks.len(), 4);
    let mut intervals = Vec::new();
    for (node, task) in &tasks {
        let s = task.status.clone().unwrap_or_default();
        assert_eq!(
            (s.phase, s.attempts),
            (NodeTaskPhase::Succeeded, 1),
            "{node}"
        );
        let mut previous_end: Option<Timestamp> = None;
        for spec in &task.spec.steps {
            let st = step_of(task, &spec.name)
                .with_context(|| format!("{node}: no status for {}", spec.name))?;
            assert_eq!(
                (st.phase, st.attempts),
                (StepPhase::Succeeded, 1),
                "{node} step {}",
                spec.name
            );
            let (start, end) = (
                st.started_at.as_ref().context("no start")?.0,
                st.finished_at.as_ref().context("no finish")?.0,
            );
            assert!(end >= start);
            if let Some(p) = previous_end {
                assert!(
                    start >= p,
                    "{node}: step {} started at {start} before the previous step finished at {p}",
                    spec.name
                );
            }
            previous_end = Some(end);
        }
        if lab.workers.contains(node) {
            intervals.push((
                started(task, "cordon")?,
                previous_end.context("no end")?,
                node.clone(),
            ));
        }
    }
    intervals.sort();
    for pair in intervals.windows(2) {
        assert!(
            pair[1].0 >= pair[0].1,
            "{} started before {} finished",
            pair[1].2,
            pair[0].2
        );
    }
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

/// An agent SIGKILLed during an idempotent step (`sleep`): the restarted agent runs the
/// step again (attempts 2), telling the plugin the previous attempt was interrupted
/// (`run-context.resumed`, which `sleep` returns as its output `resumed`), and the
/// Operation succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_mid_step_reruns_an_idempotent_step() -> Result<()> {
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (lab, mut operator) = setup("agentkill-idem").await?;
    let op = operator
        .create_operation(
            "agent-idem",
            json!({ "custom": { "groups": [{ "name": "control-plane", "nodeSelector": control_plane(),
                "steps": [ step("long", "sleep", json!({ "millis": 8000 })) ] }] } }),
        )
        .await?;
    let running = operator
        .wait_task(&op, &lab.cp, "step long Running", |t| {
            step_phase(t, "long") == StepPhase::Running
        })
        .await?;
    let first_start = started(&running, "long")?;
    operator.kill(&agent_name(&lab.cp))?;
    operator.start_agent(&lab.cp)?;
    let done = operator.wait_settled(&op).await?;
    assert_eq!(
        phase_of(&done),
        OperationPhase::Succeeded,
        "{}",
        bosun_e2e::describe_tasks(&operator.client, &op).await
    );
    let task = operator.task(&op, &lab.cp).await?;
    let long = step_of(&task, "long").context("no long status")?;
    assert_eq!((long.phase, long.attempts), (StepPhase::Succeeded, 2));
    assert!(
        started(&task, "long")? > first_start,
        "the step ran again from the start"
    );
    assert_eq!(
        long.outputs.get("resumed").map(String::as_str),
        Some("true"),
        "the re-run was told it resumes an interrupted attempt: {:?}",
        long.outputs
    );
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

/// An agent SIGKILLed during a step that is not idempotent (`sleep-once`, which writes a
/// marker when its wait is over): the restarted agent does not run it again; the task and
/// the Operation Block as Interrupted, for a person to decide, and the marker was never
/// written. A person's `recovery: Retry` then runs it again (attempt 2), telling the plugin
/// the previous attempt was interrupted (`resumed`), and it writes its marker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_killed_mid_step_blocks_a_non_idempotent_step_as_interrupted() -> Result<()> {
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (lab, mut operator) = setup("agentkill-once").await?;
    let marker = bosun_e2e::unique("once");
    let op = operator
        .create_operation(
            "agent-once",
            json!({ "custom": { "groups": [{ "name": "control-plane", "nodeSelector": control_plane(),
                "steps": [ step("once", "sleep-once", json!({ "millis": 8000, "marker": marker })) ] }] } }),
        )
        .await?;
    operator
        .wait_task(&op, &lab.cp, "step once Running", |t| {
            step_phase(t, "once") == StepPhase::Running
        })
        .await?;
    operator.kill(&agent_name(&lab.cp))?;
    operator.start_agent(&lab.cp)?;
    let blocked = operator.wait_settled(&op).await?;
    let status = blocked.status.clone().unwrap_or_default();
    assert_eq!(
        status.phase,
        OperationPhase::Blocked,
        "{:?}",
        status.message
    );
    let reason = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Blocked")
        .map(|c| c.reason.clone());
    assert_eq!(reason.as_deref(), Some("Interrupted"));
    let task = operator.task(&op, &lab.cp).await?;
    let ts = task.status.clone().unwrap_or_default();
    assert_eq!(
        (ts.phase, ts.reason),
        (NodeTaskPhase::Blocked, Some(BlockReason::Interrupted))
    );
    assert!(
        ts.message
            .as_deref()
            .unwrap_or("")
            .contains("not idempotent"),
        "{:?}",
        ts.message
    );
    let once = step_of(&task, "once").context("no once status")?;
    assert_eq!(
        (once.phase, once.attempts),
        (StepPhase::Failed, 1),
        "not run again"
    );
    assert!(
        !lab.state_file(&lab.cp, &marker).exists(),
        "the interrupted run never got to write its marker"
    );
    // A person checked the node and retries: the run is told it resumes an interrupted one.
    operator
        .patch_task_spec(&task.name_any(), json!({ "recovery": Recovery::Retry }))
        .await?;
    let done = settle_after_recovery(&mut operator, &op, &lab.cp).await?;
    assert_eq!(
        phase_of(&done),
        OperationPhase::Succeeded,
        "{}",
        bosun_e2e::describe_tasks(&operator.client, &op).await
    );
    let task = operator.task(&op, &lab.cp).await?;
    let once = step_of(&task, "once").context("no once status")?;
    assert_eq!((once.phase, once.attempts), (StepPhase::Succeeded, 2));
    assert_eq!(
        once.outputs.get("resumed").map(String::as_str),
        Some("true"),
        "the retry of the interrupted step was told it resumes: {:?}",
        once.outputs
    );
    assert!(
        lab.state_file(&lab.cp, &marker).exists(),
        "the retried run wrote its marker"
    );
    std::fs::remove_file(lab.state_file(&lab.cp, &marker))?;
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

/// An agent sent SIGTERM during a step that is not idempotent (`sleep-once`), as a rolling
/// update of the agents (`helm upgrade`) does: it starts nothing new, finishes the step,
/// writes its result and exits by itself, successfully. The step ran once (attempt 1, its
/// marker written) and the next agent runs the task's next step; nothing blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_stopped_mid_step_finishes_it_then_exits_and_the_next_agent_goes_on() -> Result<()> {
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (lab, mut operator) = setup("agentterm").await?;
    let marker = bosun_e2e::unique("term");
    let op = operator
        .create_operation(
            "agent-term",
            json!({ "custom": { "groups": [{ "name": "control-plane", "nodeSelector": control_plane(),
                "steps": [
                    step("once", "sleep-once", json!({ "millis": 4000, "marker": marker })),
                    step("next", "sleep", json!({ "millis": 100 })),
                ] }] } }),
        )
        .await?;
    operator
        .wait_task(&op, &lab.cp, "step once Running", |t| {
            step_phase(t, "once") == StepPhase::Running
        })
        .await?;
    let exit = operator
        .procs
        .terminate(&agent_name(&lab.cp), Duration::from_secs(60))
        .await?;
    assert!(exit.success(), "the agent exited with {exit} after SIGTERM");
    // It exited only after the step had ended and its result was written.
    let task = operator.task(&op, &lab.cp).await?;
    let once = step_of(&task, "once").context("no once status")?;
    assert_eq!(
        (once.phase, once.attempts),
        (StepPhase::Succeeded, 1),
        "{}",
        bosun_e2e::describe_tasks(&operator.client, &op).await
    );
    assert!(
        lab.state_file(&lab.cp, &marker).exists(),
        "the step finished: its marker is written"
    );
    assert_ne!(
        step_phase(&task, "next"),
        StepPhase::Running,
        "a stopping agent starts no new step"
    );
    operator.start_agent(&lab.cp)?;
    let done = operator.wait_settled(&op).await?;
    assert_eq!(
        phase_of(&done),
        OperationPhase::Succeeded,
        "{}",
        bosun_e2e::describe_tasks(&operator.client, &op).await
    );
    let task = operator.task(&op, &lab.cp).await?;
    for name in ["once", "next"] {
        let s = step_of(&task, name).with_context(|| format!("no {name} status"))?;
        assert_eq!((s.phase, s.attempts), (StepPhase::Succeeded, 1), "{name}");
    }
    std::fs::remove_file(lab.state_file(&lab.cp, &marker))?;
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

/// `failurePolicy: Retry` with `retryLimit: 2`: a step that keeps failing with a retryable
/// error runs three times in all, with no person involved, then the task Blocks with a
/// message saying the limit is used up and `recovery` left to a person.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_policy_retry_retries_automatically_up_to_the_limit_then_blocks() -> Result<()> {
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (lab, mut operator) = setup("autoretry").await?;
    let missing = format!("{STATE_DIR}/{}", bosun_e2e::unique("never"));
    let op = operator
        .create_operation(
            "autoretry",
            json!({ "failurePolicy": { "mode": "Retry", "retryLimit": 2, "backoffSeconds": 1 },
                "custom": { "groups": [{ "name": "control-plane", "nodeSelector": control_plane(),
                "steps": [ step("check", "require", json!({ "path": missing })) ] }] } }),
        )
        .await?;
    let task = operator
        .wait_task(&op, &lab.cp, "Blocked after the retries", |t| {
            task_phase(t) == NodeTaskPhase::Blocked
                && t.status
                    .as_ref()
                    .and_then(|s| s.message.as_deref())
                    .unwrap_or("")
                    .contains("no automatic retry")
        })
        .await?;
    let ts = task.status.clone().unwrap_or_default();
    let message = ts.message.clone().unwrap_or_default();
    assert!(message.contains("retry limit (2) is used up"), "{message}");
    let check = step_of(&task, "check").context("no check status")?;
    assert_eq!(
        (check.phase, check.attempts),
        (StepPhase::Failed, 3),
        "one run and two automatic retries"
    );
    assert_eq!(ts.attempts, 3, "each retry is a task attempt");
    assert_eq!(task.spec.recovery, None, "no person asked");
    assert_eq!(
        phase_of(&operator.wait_settled(&op).await?),
        OperationPhase::Blocked
    );
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

/// `failurePolicy: Retry`: the step fails (a file is missing), the test creates the file,
/// and the automatic retry succeeds with no `recovery` ever set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_policy_retry_succeeds_once_the_cause_is_gone() -> Result<()> {
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (lab, mut operator) = setup("autoretry-ok").await?;
    let marker = bosun_e2e::unique("later");
    let op = operator
        .create_operation(
            "autoretry-ok",
            json!({ "failurePolicy": { "mode": "Retry", "retryLimit": 3, "backoffSeconds": 2 },
                "custom": { "groups": [{ "name": "control-plane", "nodeSelector": control_plane(),
                "steps": [ step("check", "require", json!({ "path": format!("{STATE_DIR}/{marker}") })) ] }] } }),
        )
        .await?;
    operator
        .wait_task(&op, &lab.cp, "step check Failed", |t| {
            step_phase(t, "check") == StepPhase::Failed
        })
        .await?;
    std::fs::write(lab.state_file(&lab.cp, &marker), "ok\n")?;
    let done = operator
        .wait_operation(&op, "Succeeded", |o| {
            phase_of(o) == OperationPhase::Succeeded
        })
        .await?;
    assert_eq!(phase_of(&done), OperationPhase::Succeeded);
    let task = operator.task(&op, &lab.cp).await?;
    let check = step_of(&task, "check").context("no check status")?;
    assert_eq!(check.phase, StepPhase::Succeeded);
    assert!(
        (2..=4).contains(&check.attempts),
        "failed, then retried automatically: {} attempts",
        check.attempts
    );
    assert_eq!(task.spec.recovery, None);
    std::fs::remove_file(lab.state_file(&lab.cp, &marker))?;
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

/// Deleting an Operation while its tasks wait (`kubectl delete --cascade=foreground`): the
/// controller plans, creates and starts nothing for it any more. Every NodeTask event of the
/// Operation is watched from before the delete until the Operation is gone; no task appears
/// that was not there before (a recreated one has a new uid), and none starts. A sentinel
/// NodeTask created after the Operation is gone marks the end of the watch: events arrive in
/// order, so once the sentinel is seen every earlier event was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_operation_gets_no_task_recreated_or_started() -> Result<()> {
    use futures::StreamExt;
    use kube::api::{DeleteParams, PostParams};
    use kube::runtime::watcher;

    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (lab, mut operator) = setup("deleted").await?;
    let op = operator
        .create_operation(
            "deleted",
            json!({ "executionMode": "Controlled", "rollout": { "maxUnavailable": 1 }, "custom": { "groups": [
                { "name": "all", "steps": [ step("nap", "sleep", json!({ "millis": 1 })) ] } ] } }),
        )
        .await?;
    // Every task exists once the first one waits for approval (tasks are created before any
    // is started).
    operator
        .wait_task(&op, &lab.cp, "AwaitingApproval", |t| {
            task_phase(t) == NodeTaskPhase::AwaitingApproval
        })
        .await?;
    let before = operator.tasks(&op).await?;
    ensure!(
        before.len() == lab.lab.nodes.len(),
        "expected a task per node, found {:?}",
        before.keys()
    );
    let known: std::collections::BTreeSet<String> =
        before.values().filter_map(|t| t.uid()).collect();

    let tasks: Api<NodeTask> = Api::all(operator.client.clone());
    let selector = format!("bosun.dev/operation={op}");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<NodeTask>::new()));
    let log = seen.clone();
    let watch = tokio::spawn(
        watcher(tasks.clone(), watcher::Config::default().labels(&selector)).for_each(
            move |event| {
                let log = log.clone();
                async move {
                    if let Ok(watcher::Event::Apply(t) | watcher::Event::InitApply(t)) = event {
                        log.lock().unwrap().push(t);
                    }
                }
            },
        ),
    );

    let ops: Api<bosun_api::operation::Operation> = Api::all(operator.client.clone());
    ops.delete(&op, &DeleteParams::foreground())
        .await
        .with_context(|| format!("deleting Operation {op}"))?;
    operator.wait_gone(&op).await?;

    let sentinel_name = format!("{op}-sentinel");
    let mut sentinel = NodeTask::new(
        &sentinel_name,
        serde_json::from_value(
            json!({ "operation": op, "nodeName": "no-such-node", "group": "sentinel",
            // The CRD requires a step; no agent serves `no-such-node`, so it never runs.
            "steps": [ step("nap", "sleep", json!({ "millis": 1 })) ] }),
        )?,
    );
    sentinel.metadata.labels = Some(BTreeMap::from([(
        "bosun.dev/operation".to_string(),
        op.clone(),
    )]));
    tasks
        .create(&PostParams::default(), &sentinel)
        .await
        .context("creating the sentinel NodeTask")?;
    let started = std::time::Instant::now();
    while !seen
        .lock()
        .unwrap()
        .iter()
        .any(|t| t.name_any() == sentinel_name)
    {
        ensure!(
            started.elapsed() < bosun_e2e::DEADLINE,
            "the watch never saw the sentinel NodeTask"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    watch.abort();
    tasks
        .delete(&sentinel_name, &DeleteParams::default())
        .await
        .context("deleting the sentinel NodeTask")?;

    let events = seen.lock().unwrap().clone();
    for t in events.iter().filter(|t| t.name_any() != sentinel_name) {
        let uid = t.uid().unwrap_or_default();
        assert!(
            known.contains(&uid),
            "NodeTask {} (uid {uid}) was created after its Operation's deletion began",
            t.name_any()
        );
        assert!(
            matches!(
                task_phase(t),
                NodeTaskPhase::Pending | NodeTaskPhase::AwaitingApproval
            ),
            "NodeTask {} moved to {:?} while its Operation was being deleted",
            t.name_any(),
            task_phase(t)
        );
    }
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}
