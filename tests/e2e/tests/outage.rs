//! The operator rides out an API-server outage it did not expect: the lab's kube-apiserver is
//! stopped for 40 s in the middle of an Operation (as `kubeadm upgrade apply` or a
//! certificate renewal stops it on a real control plane), then started again.
//!
//! Proven here, against the lab's real kube-apiserver, etcd and kube-controller-manager:
//! - no process exits: the controller and every agent keep their process ids;
//! - the controller, whose Lease ran out during the outage, stopped its work in-process and
//!   led again in the same process (its log says so);
//! - the Operation finishes, and no step ran twice (every task and step: one attempt);
//! - the step that finished while the API server was down is recorded as finished once.
//!
//! This binary holds the only test that stops the API server: `cargo test` runs test
//! binaries one after another, so no other test sees the outage.
//!
//! Build the binaries first: `cargo build -p bosun-controller -p bosun-agent`.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use bosun_api::node_task::StepPhase;
use bosun_e2e::Operator;
use bosun_lab::Role;
use serde_json::json;

/// The directory `e2e-steps` writes in, inside each host root (granted read-write).
const STATE_DIR: &str = "/var/lib/bosun-e2e";
/// How long the API server stays down: longer than the controller's lease (15 s), so the
/// leader must lose it and lead again.
const OUTAGE: Duration = Duration::from_secs(40);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_outage_mid_operation_exits_no_process_and_runs_no_step_twice() -> Result<()>
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
    let mut operator = Operator::start(&lab, "outage")?;
    let step = |name: &str, millis: u64| json!({ "name": name, "plugin": "e2e-steps", "action": "sleep", "params": { "millis": millis } });
    let op = operator
        .create_operation(
            "outage",
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
    // The step ends (6 s) while the API server is down: its agent must record it once the
    // API server is back, without running it again.
    bosun_lab::restart_apiserver(&lab, OUTAGE).await?;
    operator.procs.check_alive()?;
    operator.wait_succeeded(&op).await?;
    operator.procs.check_alive()?;
    ensure!(
        operator.procs.pids() == before,
        "every process kept its id: {before:?} -> {:?}",
        operator.procs.pids()
    );

    let tasks = operator.tasks_each_run_once(&op, workers.len()).await?;
    for (node, task) in &tasks {
        let s = task.status.clone().unwrap_or_default();
        for st in s.steps.iter().filter(|st| st.name == "long") {
            ensure!(
                st.outputs.get("resumed").map(String::as_str) == Some("false"),
                "{node}: the step was not interrupted: {:?}",
                st.outputs
            );
        }
    }
    let log = std::fs::read_to_string(operator.procs.log_of("controller"))?;
    ensure!(
        log.contains("lost the leader lease") && log.contains("term=2"),
        "the controller lost its Lease during the {OUTAGE:?} outage and led again in the same process; see {}",
        operator.procs.log_of("controller").display()
    );
    operator.finish().await
}
