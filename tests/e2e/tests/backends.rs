//! Backends chosen per node, end to end: the real controller and one real agent per lab node
//! run a custom Operation whose step names the plugin `greeter`, which no Plugin is called.
//! Plugins declare `spec.backend: {for: greeter, osFamilies: [...]}`, and each agent chooses
//! from its own node's os-release (the lab's nodes are Debian, Rocky Linux, Ubuntu and
//! AlmaLinux: `bosun_lab` cycles them):
//!
//! - `hello` claiming `debian` and `rhel` greets every node: Debian by its `ID`, Rocky and
//!   AlmaLinux by their `ID_LIKE` (`rhel`), Ubuntu by its `ID_LIKE` (`debian`), and each
//!   step's message names the backend and the family it was chosen by;
//! - `hello` claiming only `debian`: the Rocky node's task blocks PluginUnavailable,
//!   `no-backend`, naming the node, its os-release and the plugins considered;
//! - that blocked task retried with `hello` and `good` both claiming `rhel`:
//!   `backend-ambiguous`, naming both; once `good` is deleted, a retry greets the node with
//!   `hello`.
//!
//! The choice itself is tested as a table in `runtime/agent/src/backends.rs`; this proves
//! the agent's wiring (the Plugin list, the node's os-release, the refusals in status).
//! The test changes the shared `hello` Plugin, so it holds `bosun_e2e::lock_lab_nodes`, and
//! publishes `hello` again (without a backend) before it returns.

use anyhow::{Context, Result, ensure};
use bosun_api::node_task::{BlockReason, NodeTask, NodeTaskPhase, StepPhase};
use bosun_api::operation::OperationPhase;
use bosun_api::plugin::Plugin;
use bosun_e2e::Operator;
use bosun_e2e::operator::phase_of;
use bosun_lab::LabHandle;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

/// Sets Plugin `name`'s `spec.backend`: it stands in for `greeter` on `families`.
async fn claim(lab: &LabHandle, name: &str, families: &[&str]) -> Result<()> {
    let plugins: Api<Plugin> = Api::all(lab.client.clone());
    let backend = json!({ "for": "greeter", "osFamilies": families });
    plugins
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "backend": backend } })),
        )
        .await
        .with_context(|| format!("setting spec.backend of Plugin {name}"))?;
    Ok(())
}

/// A custom Operation greeting `nodes` through the plugin name `greeter`.
fn greet(nodes: &[&str]) -> serde_json::Value {
    json!({ "custom": { "groups": [
        { "name": "nodes",
          "nodeSelector": { "matchExpressions": [
              { "key": "kubernetes.io/hostname", "operator": "In", "values": nodes }] },
          "steps": [{ "name": "greet", "plugin": "greeter", "action": "greet",
                      "params": { "name": "backends" } }] } ] } })
}

/// The lab node whose os-release `PRETTY_NAME` starts with `os`.
fn node_with(lab: &LabHandle, os: &str) -> Result<String> {
    lab.nodes
        .iter()
        .find(|n| n.os.starts_with(os))
        .map(|n| n.name.clone())
        .with_context(|| format!("the lab has no {os} node"))
}

/// The greet step's message and error code on `node`, once the Operation settled `phase`.
async fn settled_greet(
    operator: &mut Operator,
    op: &str,
    node: &str,
    phase: OperationPhase,
) -> Result<(StepPhase, String, Option<String>, Option<BlockReason>)> {
    let settled = operator.wait_settled(op).await?;
    ensure!(
        phase_of(&settled) == phase,
        "Operation {op} settled {:?}, expected {phase:?}: {}",
        phase_of(&settled),
        bosun_e2e::describe_tasks(&operator.client, op).await
    );
    let task = operator.task(op, node).await?;
    let status = task.status.clone().unwrap_or_default();
    let step = status
        .steps
        .iter()
        .find(|s| s.name == "greet")
        .cloned()
        .with_context(|| format!("no greet step on {node}: {status:?}"))?;
    Ok((
        step.phase,
        step.message.clone().unwrap_or_default(),
        step.error.map(|e| e.code),
        status.reason,
    ))
}

/// `node`'s task, checked Blocked, retried: [`crate::trust_and_capabilities::retry`].
async fn retry(operator: &mut Operator, op: &str, node: &str) -> Result<NodeTask> {
    let task = operator.task(op, node).await?;
    ensure!(
        task.status.as_ref().map(|s| s.phase) == Some(NodeTaskPhase::Blocked),
        "the task of {node} is not Blocked: {:?}",
        task.status
    );
    crate::trust_and_capabilities::retry(operator, op, node).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_agent_runs_the_backend_its_os_family_is_claimed_by_and_names_refusals() -> Result<()>
{
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    bosun_e2e::apply_crds(&lab.client).await?;
    bosun_e2e::cluster::publish_hello(&lab).await?;
    let good = bosun_e2e::build_plugin("bosun-test-good")?;
    bosun_e2e::publish_plugin(&lab.client, "good", "1.0.0", good, json!({})).await?;
    let debian = node_with(&lab, "Debian")?;
    let rocky = node_with(&lab, "Rocky")?;
    let ubuntu = node_with(&lab, "Ubuntu")?;
    let alma = node_with(&lab, "AlmaLinux")?;
    let mut operator = Operator::start(&lab, "backends")?;

    // One backend for two families: every node greeted, each by the family that matched.
    claim(&lab, "hello", &["debian", "rhel"]).await?;
    let all = [
        debian.as_str(),
        rocky.as_str(),
        ubuntu.as_str(),
        alma.as_str(),
    ];
    let op = operator
        .create_operation("backends-all", greet(&all))
        .await?;
    for (node, family) in [
        (&debian, "debian"),
        (&rocky, "rhel"),
        (&ubuntu, "debian"),
        (&alma, "rhel"),
    ] {
        let (phase, message, _, _) =
            settled_greet(&mut operator, &op, node, OperationPhase::Succeeded).await?;
        let named =
            format!("(run by Plugin hello, the backend for `greeter` steps on OS family {family})");
        ensure!(
            phase == StepPhase::Succeeded && message.contains(&named),
            "greet on {node} is {phase:?} with {message:?}, expected it to contain {named:?}"
        );
    }

    // No claim on the Rocky node's family: refused, naming the node and what was considered.
    claim(&lab, "hello", &["debian"]).await?;
    let op = operator
        .create_operation("backends-none", greet(&[&rocky]))
        .await?;
    let (phase, message, code, reason) =
        settled_greet(&mut operator, &op, &rocky, OperationPhase::Blocked).await?;
    ensure!(
        phase == StepPhase::Failed
            && code.as_deref() == Some("no-backend")
            && reason == Some(BlockReason::PluginUnavailable),
        "greet on {rocky}: {phase:?}, code {code:?}, reason {reason:?}: {message}"
    );
    for part in [
        format!("node {rocky} (ID=rocky, ID_LIKE=\"rhel centos fedora\")"),
        "no Plugin serves `greeter` steps on this OS family".to_string(),
        "considered: hello (debian)".to_string(),
    ] {
        ensure!(message.contains(&part), "{message:?} lacks {part:?}");
    }

    // The same blocked task, retried with two claims on the family that decides: refused,
    // naming both (the task keeps the node: one Operation per node). Without one, a retry
    // greets the node.
    claim(&lab, "hello", &["debian", "rhel"]).await?;
    claim(&lab, "good", &["rhel"]).await?;
    let task = retry(&mut operator, &op, &rocky).await?;
    let step = crate::trust_and_capabilities::greet(&task)?;
    let message = step.message.clone().unwrap_or_default();
    let code = step.error.as_ref().map(|e| e.code.as_str());
    let both =
        "Plugins good and hello each declare spec.backend for `greeter` steps on OS family rhel";
    ensure!(
        step.phase == StepPhase::Failed
            && code == Some("backend-ambiguous")
            && message.contains(both),
        "greet on {rocky}: {:?}, code {code:?}: {message:?} (expected {both:?})",
        step.phase
    );
    let plugins: Api<Plugin> = Api::all(lab.client.clone());
    plugins
        .delete("good", &DeleteParams::default())
        .await
        .context("deleting Plugin good")?;
    let task = retry(&mut operator, &op, &rocky).await?;
    let step = crate::trust_and_capabilities::greet(&task)?;
    let message = step.message.clone().unwrap_or_default();
    ensure!(
        step.phase == StepPhase::Succeeded && message.contains("run by Plugin hello"),
        "after the retry: {:?}: {message:?}",
        step.phase
    );
    operator
        .wait_operation(&op, "Succeeded after the retry", |o| {
            phase_of(o) == OperationPhase::Succeeded
        })
        .await?;

    bosun_e2e::cluster::publish_hello(&lab).await?;
    operator.finish().await?;
    Ok(())
}
