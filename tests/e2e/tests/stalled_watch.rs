//! The controller sees an agent's step result even when the API server it watches through
//! stops delivering, as an API server whose etcd member was just restarted did on the
//! real-node cluster (its watches stayed open and silent for 97 s).
//!
//! The controller reaches the lab's kube-apiserver through a relay
//! ([`bosun_e2e::stall::StallingRelay`]); the agents reach it directly. While a worker's
//! agent runs a 6 s step, every connection the controller has open is stalled: its watches
//! and pooled connections stay open and bring nothing more. Proven here:
//! - the Operation still finishes: the controller found its NodeTask watch silent while the
//!   API server held a newer task, and watched again on a new connection (its log says
//!   so, naming the task);
//! - no process exited, and no step ran twice.
//!
//! Without the freshness check the stalled watch would bring the step's result only when
//! its connection ends: never, in this test (the relay holds even the end of stream).
//!
//! Build the binaries first: `cargo build -p bosun-controller -p bosun-agent`.

use anyhow::{Context, Result, ensure};
use bosun_api::node_task::StepPhase;
use bosun_e2e::Operator;
use bosun_e2e::stall::StallingRelay;
use bosun_lab::Role;
use serde_json::json;

/// The directory `e2e-steps` writes in, inside each host root (granted read-write).
const STATE_DIR: &str = "/var/lib/bosun-e2e";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_stalled_by_its_api_server_is_opened_again_and_the_operation_finishes() -> Result<()>
{
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    bosun_e2e::apply_crds(&lab.client).await?;
    bosun_e2e::publish_test_steps(&lab.client, STATE_DIR).await?;
    for node in &lab.nodes {
        std::fs::create_dir_all(node.host_root.join(STATE_DIR.trim_start_matches('/')))?;
    }
    let mut workers = lab.names(Role::Worker);
    workers.sort();
    let first = workers.first().context("the lab has a worker")?.clone();

    let relay = StallingRelay::start(lab.ports.apiserver).await?;
    let kubeconfig = relay.controller_kubeconfig(&lab, "e2e-stalled-watch")?;
    let mut operator = Operator::start_with_controller_kubeconfig(&lab, "stalled", &kubeconfig)?;

    let step = |name: &str, millis: u64| json!({ "name": name, "plugin": "e2e-steps", "action": "sleep", "params": { "millis": millis } });
    let op = operator
        .create_operation(
            "stalled",
            json!({ "rollout": { "maxUnavailable": 1 }, "custom": { "groups": [
                { "name": "workers", "nodeSelector": { "matchExpressions": [{ "key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist" }] },
                  "steps": [
                    { "name": "cordon", "runsOn": "controller", "action": "cordon" },
                    step("long", 6000),
                    { "name": "uncordon", "runsOn": "controller", "action": "uncordon" } ] } ] } }),
        )
        .await?;
    operator
        .wait_task(&op, &first, "step long Running", |t| {
            t.status
                .as_ref()
                .and_then(|s| s.steps.iter().find(|x| x.name == "long"))
                .is_some_and(|s| s.phase == StepPhase::Running)
        })
        .await?;
    let before = operator.procs.pids();
    let stalled = relay.stall_open_connections();
    ensure!(
        stalled > 0,
        "the controller reaches the API server through the relay"
    );

    operator.wait_succeeded(&op).await?;
    operator.procs.check_alive()?;
    ensure!(
        operator.procs.pids() == before,
        "every process kept its id: {before:?} -> {:?}",
        operator.procs.pids()
    );
    let tasks = operator.tasks_each_run_once(&op, workers.len()).await?;
    let task_name = tasks[&first].metadata.name.clone().unwrap_or_default();
    let log = std::fs::read_to_string(operator.procs.log_of("controller"))?;
    ensure!(
        log.lines()
            .any(|l| l.contains("watching again on a new connection")
                && l.contains(&format!("object={task_name}"))),
        "the controller said it watched NodeTasks again after finding {task_name} newer on the API server; see {}",
        operator.procs.log_of("controller").display()
    );
    operator.finish().await
}
