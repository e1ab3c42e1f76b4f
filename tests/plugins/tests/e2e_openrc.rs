//! The kubelet plugin restarts the kubelet on an OpenRC node of the lab, end to end: a node
//! root with the real OpenRC (`OpenRcNode`: Debian's openrc 0.45, `/run/openrc` as it is
//! after boot, a `kubelet` service under `supervise-daemon` whose daemon is a stand-in),
//! registered as a lab Node (a fleet node), its agent choosing OpenRC by itself
//! (`--service-backend` left at `auto`), and a policy that reads which init system the node
//! uses (`input.node.serviceManager`).

use anyhow::{Context, Result, ensure};
use bosun_api::node_task::{NodeTaskPhase, StepPhase};
use bosun_e2e::operator::Operator;
use bosun_plugins_tests::{
    OpenRcNode, example_grants, plugins, processes_in, rc_service, stop_openrc,
};
use kube::ResourceExt;
use serde_json::json;

const PREFIX: &str = "openrc-";
const POLICY: &str = "e2e-openrc-hold";

/// Removes what a failed earlier run left: the Policy, the fleet Node and its root (with
/// OpenRC's services stopped and its `/proc` unmounted first).
async fn clean(lab: &bosun_lab::LabHandle) -> Result<()> {
    let root = lab.state_dir.join("nodes").join(format!("{PREFIX}0001"));
    if root.join("run/openrc").exists() {
        stop_openrc(&root);
    }
    let _ = kube::Api::<bosun_api::policy::Policy>::all(lab.client.clone())
        .delete(POLICY, &Default::default())
        .await;
    bosun_lab::remove_fleet_nodes(lab, PREFIX).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelet_restarts_on_an_openrc_node_and_policy_sees_the_init_system() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    bosun_e2e::apply_crds(&lab.client).await?;
    clean(&lab).await?;
    let node = bosun_lab::add_fleet_nodes(&lab, PREFIX, 1)
        .await?
        .pop()
        .context("one fleet node")?;
    let openrc = OpenRcNode::new(&node.host_root);
    let root = node.host_root.clone();
    let starts = || {
        std::fs::read_to_string(root.join("var/log/kubelet-starts"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    let started = rc_service(&root, &["kubelet", "start"]);
    ensure!(started.status.success(), "{started:?}");
    let before = processes_in(&root);
    ensure!(starts() == 1 && before.len() == 2, "{before:?}");

    bosun_e2e::publish_plugin(
        &lab.client,
        "kubelet",
        env!("CARGO_PKG_VERSION"),
        plugins().kubelet.clone(),
        serde_json::to_value(example_grants("kubelet.yaml"))?,
    )
    .await?;
    let mut operator = Operator::start(&lab, "openrc")?;
    operator.add_node(&node.name, &root)?;
    // A security team holds kubelet restarts on OpenRC nodes (a Policy of the agents'
    // instance, which they list before each step).
    let policy: bosun_api::policy::Policy = serde_json::from_value(json!({
        "apiVersion": "bosun.dev/v1alpha1",
        "kind": "Policy",
        "metadata": {
            "name": POLICY,
            "labels": { bosun_e2e::operator::INSTANCE_LABEL: operator.instance },
        },
        "spec": { "rego": "package bosun.step.openrc_hold\n\ndeny contains msg if {\n\tinput.plugin.name == \"kubelet\"\n\tinput.node.serviceManager == \"openrc\"\n\tmsg := sprintf(\"kubelet restarts on %s nodes wait for the OpenRC runbook\", [input.node.serviceManager])\n}\n" },
    }))?;
    let policies: kube::Api<bosun_api::policy::Policy> = kube::Api::all(lab.client.clone());
    policies
        .create(&Default::default(), &policy)
        .await
        .context("creating the Policy")?;

    let name = operator
        .create_operation(
            "openrc",
            json!({
                "custom": { "groups": [{ "name": "restart", "steps": [
                    { "name": "restart-kubelet", "plugin": "kubelet", "action": "restart",
                      "params": { "settleSeconds": 1 } },
                ] }] },
                "nodeSelector": { "matchLabels": { "kubernetes.io/hostname": node.name } },
            }),
        )
        .await?;
    let blocked = operator
        .wait_task(&name, &node.name, "Blocked by the policy", |t| {
            t.status
                .as_ref()
                .is_some_and(|s| s.phase == NodeTaskPhase::Blocked)
        })
        .await?;
    let message = blocked
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default();
    println!("{message}");
    ensure!(
        message.contains("kubelet restarts on openrc nodes wait for the OpenRC runbook"),
        "{message}"
    );
    ensure!(starts() == 1, "the held step restarted the kubelet");

    policies.delete(POLICY, &Default::default()).await?;
    operator
        .patch_task_spec(&blocked.name_any(), json!({ "recovery": "Retry" }))
        .await?;
    operator
        .wait_task(&name, &node.name, "Succeeded after the retry", |t| {
            t.status
                .as_ref()
                .is_some_and(|s| s.phase == NodeTaskPhase::Succeeded)
        })
        .await?;
    operator.wait_succeeded(&name).await?;
    let task = operator.task(&name, &node.name).await?;
    let step = task
        .status
        .as_ref()
        .and_then(|s| s.steps.iter().find(|x| x.name == "restart-kubelet"))
        .context("the step's entry")?
        .clone();
    println!("{}", step.message.clone().unwrap_or_default());
    ensure!(
        step.phase == StepPhase::Succeeded
            && step.changed == Some(true)
            && step
                .message
                .as_deref()
                .is_some_and(|m| m.starts_with("restarted kubelet.service; running after")),
        "{step:?}"
    );
    // OpenRC stopped the old daemon and started a new one, which outlived the step.
    let after = processes_in(&root);
    ensure!(starts() == 2, "kubelet started {} times", starts());
    ensure!(
        after.len() == 2 && after.iter().all(|p| !before.contains(p)),
        "before {before:?}, after {after:?}"
    );
    let status = rc_service(&root, &["kubelet", "status"]);
    ensure!(
        String::from_utf8_lossy(&status.stdout).contains("status: started"),
        "{status:?}"
    );
    let log = std::fs::read_to_string(
        operator
            .procs
            .log_of(&bosun_e2e::operator::agent_name(&node.name)),
    )?;
    ensure!(
        log.contains("services of this node are driven through openrc"),
        "the agent's log does not say it chose OpenRC"
    );
    operator.procs.check_alive()?;
    operator.finish().await?;
    drop(openrc);
    ensure!(
        processes_in(&root).is_empty(),
        "OpenRC's services still run"
    );
    clean(&lab).await
}
