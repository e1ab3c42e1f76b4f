//! The cordon a NodeTask relies on is watched (issue 39): when someone else uncordons the
//! node between the task's `cordon` and its `uncordon` (here by hand, as `kubectl uncordon`
//! does), the next agent step and the next `drain` do not start. The task blocks with
//! reason `CordonCleared`, the step's error names the node, the step that cordoned it and
//! what to do, and a Warning Event `CordonCleared` says the same. Bosun does not cordon the
//! node again by itself; once a person has, a retry runs the step and the Operation
//! finishes.
//!
//! Every test runs its own real `bosun-controller` and one real `bosun-agent` per lab node,
//! scoped to its own instance (`bosun_e2e::Operator`), on one lab worker, and holds
//! `bosun_e2e::lock_lab_nodes` (the nodes' cordon state is shared). The agent steps come
//! from the `e2e-steps` test plugin (plugins/testing/steps). Whatever a test ends with, it
//! leaves its node schedulable.
//!
//! Build the binaries first: `cargo build -p bosun-controller -p bosun-agent`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bosun_api::node_task::{BlockReason, NodeTask, NodeTaskPhase, StepPhase, StepStatus};
use bosun_api::operation::{Operation, OperationPhase};
use bosun_e2e::operator::phase_of;
use bosun_e2e::{DEADLINE, Operator};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// The directory `e2e-steps` writes in, inside each host root (granted read-write).
const STATE_DIR: &str = "/var/lib/bosun-e2e";
/// The lab worker these tests run on. (Not `lab-worker-2`: lifecycle.rs leaves unmanaged
/// Pods bound to it, which a drain refuses to evict.)
const NODE: &str = "lab-worker-1";

/// The lab, CRDs, `e2e-steps` published, `STATE_DIR` in the node's host root, an operator
/// for this test, and the node's host root.
async fn setup(test: &str) -> Result<(Operator, std::path::PathBuf)> {
    let lab = bosun_lab::ensure_lab().await?;
    let root = lab
        .nodes
        .iter()
        .find(|n| n.name == NODE)
        .map(|n| n.host_root.clone())
        .with_context(|| {
            format!("the lab has no node {NODE} (these tests expect the default lab)")
        })?;
    bosun_e2e::apply_crds(&lab.client).await?;
    bosun_e2e::publish_test_steps(&lab.client, STATE_DIR).await?;
    std::fs::create_dir_all(root.join(STATE_DIR.trim_start_matches('/')))?;
    // Start from a schedulable node, as a person's cluster would be.
    set_unschedulable(&lab.client, false).await?;
    let operator = Operator::start(&lab, test)?;
    Ok((operator, root))
}

/// Runs `body`, then makes the node schedulable again whatever `body` returned (a test that
/// fails mid-way must not leave the shared node cordoned for the next one).
async fn leaving_the_node_schedulable<Fut>(client: &Client, body: Fut) -> Result<()>
where
    Fut: std::future::Future<Output = Result<()>>,
{
    let result = body.await;
    let restored = set_unschedulable(client, false).await;
    result.and(restored)
}

/// Cordons or uncordons the node as `kubectl cordon` / `kubectl uncordon` do: a patch of
/// `spec.unschedulable` only (uncordon removes the field).
async fn set_unschedulable(client: &Client, cordoned: bool) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let value = if cordoned { json!(true) } else { json!(null) };
    nodes
        .patch(
            NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "unschedulable": value } })),
        )
        .await
        .with_context(|| format!("setting spec.unschedulable={cordoned} on {NODE}"))?;
    Ok(())
}

async fn is_unschedulable(client: &Client) -> Result<bool> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get(NODE).await.context("reading the node")?;
    Ok(node.spec.and_then(|s| s.unschedulable).unwrap_or(false))
}

/// The custom-group selector of the test's node.
fn this_node() -> serde_json::Value {
    json!({ "matchLabels": { "kubernetes.io/hostname": NODE } })
}

/// An `e2e-steps` step.
fn step(name: &str, action: &str, params: serde_json::Value) -> serde_json::Value {
    json!({ "name": name, "plugin": "e2e-steps", "action": action, "params": params })
}

fn controller(name: &str, action: &str) -> serde_json::Value {
    json!({ "name": name, "runsOn": "controller", "action": action })
}

fn step_of<'a>(task: &'a NodeTask, name: &str) -> Option<&'a StepStatus> {
    task.status
        .as_ref()
        .and_then(|s| s.steps.iter().find(|x| x.name == name))
}

fn blocked_by(task: &NodeTask, reason: BlockReason) -> bool {
    task.spec.recovery.is_none()
        && task
            .status
            .as_ref()
            .is_some_and(|s| s.phase == NodeTaskPhase::Blocked && s.reason == Some(reason))
}

/// Polls until the Events about object `name` include one with each of `reasons`.
async fn events_with(client: &Client, name: &str, reasons: &[&str]) -> Result<Vec<Event>> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    let started = Instant::now();
    loop {
        let events: Vec<Event> = api
            .list(&ListParams::default())
            .await
            .context("listing Events")?
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect();
        let found: BTreeSet<&str> = events.iter().filter_map(|e| e.reason.as_deref()).collect();
        if reasons.iter().all(|r| found.contains(r)) {
            return Ok(events);
        }
        if started.elapsed() > DEADLINE {
            bail!("Events about {name}: wanted {reasons:?}, found {found:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn note_of<'a>(events: &'a [Event], reason: &str) -> Vec<&'a str> {
    events
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.note.as_deref())
        .collect()
}

/// The Operation's `Blocked` condition: (status, reason).
fn blocked_condition(op: &Operation) -> Option<(String, String)> {
    op.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Blocked")
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// After a `recovery: Retry` of the failed step `step` (which had run `attempts` times):
/// waits until the controller acted on it (cleared it, and the step ran again) and the task
/// settled, then requires the task and the Operation Succeeded.
async fn retried_then_succeeded(
    operator: &mut Operator,
    op: &str,
    step: &str,
    attempts: u32,
) -> Result<Operation> {
    let task = operator
        .wait_task(op, NODE, "the retried step ran and the task settled", |t| {
            t.spec.recovery.is_none()
                && step_of(t, step).is_some_and(|s| s.attempts > attempts)
                && t.status.as_ref().is_some_and(|s| {
                    matches!(s.phase, NodeTaskPhase::Succeeded | NodeTaskPhase::Blocked)
                })
        })
        .await?;
    let status = task.status.clone().unwrap_or_default();
    ensure!(
        status.phase == NodeTaskPhase::Succeeded,
        "the task ended {:?} ({:?}): {:?}",
        status.phase,
        status.reason,
        status.message
    );
    operator
        .wait_operation(op, "Succeeded", |o| {
            phase_of(o) == OperationPhase::Succeeded
        })
        .await
}

/// Every version of NodeTask `name` from `version` on, until one satisfies `done` (which is
/// returned with them): what a watch shows, so no write in between goes unseen.
async fn versions_until(
    client: &Client,
    name: &str,
    version: &str,
    done: impl Fn(&NodeTask) -> bool,
) -> Result<Vec<NodeTask>> {
    let api: Api<NodeTask> = Api::all(client.clone());
    let params = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(DEADLINE.as_secs() as u32);
    let mut stream = api
        .watch(&params, version)
        .await
        .context("watching the NodeTask")?
        .boxed();
    let mut seen = Vec::new();
    while let Some(event) = stream.try_next().await.context("watching the NodeTask")? {
        match event {
            WatchEvent::Added(t) | WatchEvent::Modified(t) => {
                let wanted = done(&t);
                let status = t.status.clone().unwrap_or_default();
                seen.push(t);
                if wanted {
                    return Ok(seen);
                }
                ensure!(
                    !status.phase.is_finished(),
                    "NodeTask {name} finished ({:?}) without reaching the wanted state: {status:?}",
                    status.phase
                );
            }
            WatchEvent::Deleted(_) => bail!("NodeTask {name} was deleted"),
            WatchEvent::Bookmark(_) => {}
            WatchEvent::Error(e) => bail!("watching NodeTask {name}: {e:?}"),
        }
    }
    bail!(
        "the watch of NodeTask {name} ended before the wanted state; last seen: {:?}",
        seen.last().and_then(|t| t.status.clone())
    )
}

/// An agent step is blocked by a failure of its own (a missing file), and while the task
/// waits for a person someone uncordons the node. The person fixes the cause and retries:
/// the agent does not run the step on the schedulable node. The task blocks again, now as
/// CordonCleared, with no Running write of the step, no plugin run (no outputs, the next
/// step never starts) and the node left schedulable. Cordoned again by hand and retried,
/// the step runs and the Operation succeeds, the node uncordoned by its `uncordon`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_step_does_not_start_on_a_node_someone_uncordoned() -> Result<()> {
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (mut operator, root) = setup("cordon-agent").await?;
    let client = operator.client.clone();
    leaving_the_node_schedulable(&client.clone(), async {
        let marker = bosun_e2e::unique("ready");
        let written = bosun_e2e::unique("written");
        let host = |name: &str| root.join(STATE_DIR.trim_start_matches('/')).join(name);
        let op = operator
            .create_operation(
                "cordon-agent",
                json!({ "custom": { "groups": [{ "name": "worker", "nodeSelector": this_node(),
                    "steps": [
                        controller("cordon", "cordon"),
                        step("check", "require", json!({ "path": format!("{STATE_DIR}/{marker}") })),
                        step("after", "write", json!({ "name": written, "content": "ran\n" })),
                        controller("uncordon", "uncordon"),
                    ] }] } }),
            )
            .await?;

        // The first failure is the step's own.
        let blocked = operator.wait_settled(&op).await?;
        ensure!(
            phase_of(&blocked) == OperationPhase::Blocked,
            "{:?}",
            blocked.status
        );
        let task = operator.task(&op, NODE).await?;
        let check = step_of(&task, "check").context("no check status")?;
        ensure!(
            (check.phase, check.attempts) == (StepPhase::Failed, 1)
                && check.error.as_ref().map(|e| e.code.as_str()) == Some("missing"),
            "{check:?}"
        );
        ensure!(is_unschedulable(&client).await?, "the task's cordon holds");

        // Someone else uncordons the node; the person fixes the cause and retries.
        set_unschedulable(&client, false).await?;
        std::fs::write(host(&marker), "ok\n")?;
        let version = task
            .resource_version()
            .context("the task has no resourceVersion")?;
        let name = task.name_any();
        let watch = versions_until(&client, &name, &version, |t| {
            blocked_by(t, BlockReason::CordonCleared)
        });
        operator
            .patch_task_spec(&name, json!({ "recovery": "Retry" }))
            .await?;
        let versions = watch.await?;

        // Blocked as CordonCleared; the step was never written Running again.
        let retried: Vec<&StepStatus> = versions
            .iter()
            .filter_map(|t| step_of(t, "check"))
            .filter(|s| s.attempts == 2)
            .collect();
        ensure!(
            retried.iter().all(|s| s.phase != StepPhase::Running),
            "the refused attempt was written Running: {retried:?}"
        );
        let task = versions.last().context("no version")?.clone();
        let status = task.status.clone().unwrap_or_default();
        let check = step_of(&task, "check").context("no check status")?;
        ensure!(
            (check.phase, check.attempts) == (StepPhase::Failed, 2),
            "{check:?}"
        );
        let error = check.error.clone().context("no error")?;
        ensure!(
            (error.code.as_str(), error.retryable) == ("cordon-cleared", false),
            "{error:?}"
        );
        ensure!(
            error.message.starts_with(&format!(
                "node {NODE} is schedulable again: step `cordon` cordoned it, and someone else uncordoned it since"
            )) && error
                .message
                .contains("Bosun does not start `check` on a schedulable node")
                && error.message.contains(&format!("kubectl cordon {NODE}")),
            "{}",
            error.message
        );
        ensure!(
            check.outputs.is_empty() && check.log_tail.is_empty(),
            "the plugin did not run: {check:?}"
        );
        ensure!(
            step_of(&task, "after").is_none_or(|s| s.phase == StepPhase::Pending)
                && !host(&written).exists(),
            "nothing after the refused step ran: {:?}",
            step_of(&task, "after")
        );
        ensure!(
            status
                .message
                .as_deref()
                .is_some_and(|m| m.contains(&format!("node {NODE} is schedulable again"))),
            "{status:?}"
        );
        ensure!(
            !is_unschedulable(&client).await?,
            "Bosun did not cordon the node again by itself"
        );
        let events = events_with(&client, &name, &["CordonCleared", "Blocked"]).await?;
        let cleared = note_of(&events, "CordonCleared");
        ensure!(
            cleared
                .iter()
                .any(|n| n.starts_with(&format!("step check: node {NODE} is schedulable again"))),
            "{cleared:?}"
        );
        let blocked = operator
            .wait_operation(&op, "Blocked as CordonCleared", |o| {
                blocked_condition(o).is_some_and(|(_, r)| r == "CordonCleared")
            })
            .await?;
        ensure!(phase_of(&blocked) == OperationPhase::Blocked);

        // Cordoned again by hand, retried: the step runs, the Operation finishes.
        set_unschedulable(&client, true).await?;
        operator
            .patch_task_spec(&name, json!({ "recovery": "Retry" }))
            .await?;
        retried_then_succeeded(&mut operator, &op, "check", 2).await?;
        let task = operator.task(&op, NODE).await?;
        let check = step_of(&task, "check").context("no check status")?;
        ensure!(
            (check.phase, check.attempts) == (StepPhase::Succeeded, 3) && check.error.is_none(),
            "{check:?}"
        );
        ensure!(
            step_of(&task, "after").map(|s| s.phase) == Some(StepPhase::Succeeded)
                && host(&written).exists(),
            "the next step ran"
        );
        ensure!(
            !is_unschedulable(&client).await?,
            "the task's uncordon made the node schedulable"
        );
        std::fs::remove_file(host(&marker))?;
        std::fs::remove_file(host(&written))?;
        Ok(())
    })
    .await?;
    operator.procs.check_alive()?;
    operator.finish().await
}

/// The node is uncordoned by hand while an agent step runs (it finishes: the check is
/// before a step starts). The `drain` after it does not run on the schedulable node: it
/// fails at once as CordonCleared, evicts nothing and does not cordon the node again, and
/// the controller publishes a Warning Event `CordonCleared`. Cordoned again by hand and
/// retried, the drain runs and the Operation succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_does_not_start_on_a_node_someone_uncordoned() -> Result<()> {
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (mut operator, _root) = setup("cordon-drain").await?;
    let client = operator.client.clone();
    leaving_the_node_schedulable(&client.clone(), async {
        let op = operator
            .create_operation(
                "cordon-drain",
                json!({ "custom": { "groups": [{ "name": "worker", "nodeSelector": this_node(),
                    "steps": [
                        controller("cordon", "cordon"),
                        step("nap", "sleep", json!({ "millis": 6000 })),
                        controller("drain", "drain"),
                        controller("uncordon", "uncordon"),
                    ] }] } }),
            )
            .await?;
        operator
            .wait_task(&op, NODE, "step nap Running", |t| {
                step_of(t, "nap").is_some_and(|s| s.phase == StepPhase::Running)
            })
            .await?;
        set_unschedulable(&client, false).await?;

        let task = operator
            .wait_task(&op, NODE, "Blocked as CordonCleared (or finished)", |t| {
                blocked_by(t, BlockReason::CordonCleared)
                    || t.status.as_ref().is_some_and(|s| s.phase.is_finished())
            })
            .await?;
        ensure!(
            blocked_by(&task, BlockReason::CordonCleared),
            "the drain ran on the uncordoned node: {:?}",
            task.status
        );
        ensure!(
            step_of(&task, "nap").map(|s| s.phase) == Some(StepPhase::Succeeded),
            "the running step finished: {:?}",
            step_of(&task, "nap")
        );
        let drain = step_of(&task, "drain").context("no drain status")?;
        ensure!(
            (drain.phase, drain.attempts) == (StepPhase::Failed, 1),
            "{drain:?}"
        );
        let error = drain.error.clone().context("no error")?;
        ensure!(
            (error.code.as_str(), error.retryable) == ("cordon-cleared", false)
                && error.message.starts_with(&format!(
                    "node {NODE} is schedulable again: step `cordon` cordoned it"
                ))
                && error
                    .message
                    .contains("Bosun does not start `drain` on a schedulable node"),
            "{error:?}"
        );
        ensure!(
            !is_unschedulable(&client).await?,
            "the drain did not cordon the node again"
        );
        let events = events_with(&client, &task.name_any(), &["CordonCleared", "Blocked"]).await?;
        ensure!(
            note_of(&events, "Drained").is_empty(),
            "nothing was drained: {events:?}"
        );

        set_unschedulable(&client, true).await?;
        operator
            .patch_task_spec(&task.name_any(), json!({ "recovery": "Retry" }))
            .await?;
        retried_then_succeeded(&mut operator, &op, "drain", 1).await?;
        let task = operator.task(&op, NODE).await?;
        ensure!(
            step_of(&task, "drain").map(|s| (s.phase, s.attempts))
                == Some((StepPhase::Succeeded, 2)),
            "{:?}",
            step_of(&task, "drain")
        );
        ensure!(
            !is_unschedulable(&client).await?,
            "the task's uncordon made the node schedulable"
        );
        Ok(())
    })
    .await?;
    operator.procs.check_alive()?;
    operator.finish().await
}

/// A cordon Bosun made and never undid (its Operation deleted mid-drain; here the node is
/// cordoned with the mark the controller writes, `bosun.dev/cordon: <task> cordoned`) is
/// undone by the next upgrade: its plan keeps `uncordon` for the node, and the Planned
/// condition says why. A person's cordon (no mark) is left alone: no `uncordon`. DryRun
/// upgrades: only their plans matter here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_undoes_a_cordon_bosun_left_behind_but_not_a_persons() -> Result<()> {
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let (mut operator, _root) = setup("cordon-leftover").await?;
    let lab = bosun_lab::ensure_lab().await?;
    let version = bosun_e2e::lifecycle::lab_version(&lab);
    let client = operator.client.clone();
    leaving_the_node_schedulable(&client.clone(), async {
        let nodes: Api<Node> = Api::all(client.clone());
        let leftover = format!("gone-op-{NODE} cordoned");
        for (mark, uncordons) in [(Some(leftover.as_str()), true), (None, false)] {
            nodes
                .patch(
                    NODE,
                    &PatchParams::default(),
                    &Patch::Merge(json!({
                        "metadata": { "annotations": { "bosun.dev/cordon": mark } },
                        "spec": { "unschedulable": true },
                    })),
                )
                .await?;
            let op = operator
                .create_operation(
                    "cordon-leftover",
                    json!({ "executionMode": "DryRun",
                            "upgrade": { "kubernetesVersion": version, "packages": [] } }),
                )
                .await?;
            let planned = operator
                .wait_operation(&op, "planned", |o| {
                    o.status.as_ref().is_some_and(|s| s.plan.is_some())
                })
                .await?;
            let task = operator.wait_task(&op, NODE, "created", |_| true).await?;
            let steps: Vec<&str> = task.spec.steps.iter().map(|s| s.name.as_str()).collect();
            ensure!(
                steps.contains(&"uncordon") == uncordons,
                "mark {mark:?}: uncordon planned must be {uncordons}: {steps:?}"
            );
            let notes = planned
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Planned"))
                .map(|c| c.message.clone())
                .unwrap_or_default();
            let expected = if uncordons {
                format!("node {NODE} is still cordoned by Bosun (NodeTask gone-op-{NODE}, which never uncordoned it): this Operation uncordons it")
            } else {
                format!("node {NODE} was already cordoned: Bosun leaves it cordoned afterwards")
            };
            ensure!(notes.contains(&expected), "mark {mark:?}: {notes}");
            // Only the plan matters: a DryRun changes nothing on the nodes, so it can go.
            Api::<Operation>::all(client.clone())
                .delete(&op, &Default::default())
                .await?;
        }
        Ok(())
    })
    .await?;
    operator.finish().await
}
