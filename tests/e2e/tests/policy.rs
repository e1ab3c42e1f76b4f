//! Policy gating end to end: real `Policy` objects, the real controller (policy status,
//! operation gate) and real agents (step gate) against the lab's kube-apiserver, running
//! the signed `hello` plugin.
//!
//! Each test labels its Policies with its operator's instance (`bosun.dev/instance`), the
//! same label that scopes its Operations: its controller and agents see only its own
//! policies, so tests (and other test binaries on the same lab) never gate each other.
//! Tests hold `bosun_e2e::lock_lab_nodes` because the lab's nodes are shared.
//!
//! Build the binaries first: `cargo build -p bosun-controller -p bosun-agent`.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bosun_api::node_task::{BlockReason, NodeTask, NodeTaskPhase, StepPhase};
use bosun_api::operation::OperationPhase;
use bosun_api::policy::{Enforcement, Policy};
use bosun_e2e::operator::INSTANCE_LABEL;
use bosun_e2e::{Operator, events_about};
use bosun_lab::{LabHandle, Role};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// The control-plane node of the default lab.
fn control_plane(lab: &LabHandle) -> Result<String> {
    lab.nodes
        .iter()
        .find(|n| n.role == Role::ControlPlane)
        .map(|n| n.name.clone())
        .context("the lab has no control-plane node")
}

/// CRDs, the hello plugin, and an operator for this test.
async fn setup(lab: &LabHandle, test: &str) -> Result<Operator> {
    bosun_e2e::apply_crds(&lab.client).await?;
    bosun_e2e::cluster::publish_hello(lab).await?;
    Operator::start(lab, test)
}

/// Creates (or replaces) a Policy scoped to `operator`'s instance.
async fn apply_policy(
    operator: &Operator,
    name: &str,
    enforcement: &str,
    rego: &str,
    data: serde_json::Value,
) -> Result<()> {
    let api: Api<Policy> = Api::all(operator.client.clone());
    let policy = json!({
        "apiVersion": "bosun.dev/v1alpha1", "kind": "Policy",
        "metadata": { "name": name, "labels": { INSTANCE_LABEL: operator.instance } },
        "spec": { "rego": rego, "data": data, "enforcement": enforcement },
    });
    api.patch(
        name,
        &PatchParams::apply(bosun_e2e::MANAGER).force(),
        &Patch::Apply(policy),
    )
    .await
    .with_context(|| format!("applying Policy {name}"))?;
    Ok(())
}

async fn delete_policy(client: &Client, name: &str) -> Result<()> {
    let api: Api<Policy> = Api::all(client.clone());
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("deleting Policy {name}")),
    }
}

/// Waits until Policy `name` has a status for its current generation that satisfies `done`.
async fn wait_policy(
    client: &Client,
    name: &str,
    done: impl Fn(&Policy) -> bool,
) -> Result<Policy> {
    let api: Api<Policy> = Api::all(client.clone());
    let started = Instant::now();
    loop {
        let p = api
            .get(name)
            .await
            .with_context(|| format!("getting Policy {name}"))?;
        let current =
            p.status.as_ref().and_then(|s| s.observed_generation) == p.metadata.generation;
        if current && done(&p) {
            return Ok(p);
        }
        if started.elapsed() > bosun_e2e::DEADLINE {
            bail!(
                "Policy {name} never got the expected status; last seen: {:?}",
                p.status
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// An Operation greeting only the control-plane node.
fn greet_control_plane() -> serde_json::Value {
    json!({ "custom": { "groups": [
        { "name": "control-plane",
          "nodeSelector": { "matchExpressions": [{ "key": "node-role.kubernetes.io/control-plane", "operator": "Exists" }] },
          "steps": [{ "name": "greet", "plugin": "hello", "action": "greet", "params": { "name": "e2e" } }] } ] } })
}

fn greet_status(task: &NodeTask) -> Result<bosun_api::node_task::StepStatus> {
    task.status
        .as_ref()
        .and_then(|s| s.steps.iter().find(|s| s.name == "greet"))
        .cloned()
        .context("no greet step status")
}

const DENY_HELLO: &str = r#"package bosun.step.e2e_hold

deny contains msg if {
	data.e2e.hold_hello
	input.step.plugin == "hello"
	msg := sprintf("hello is on hold on %s (e2e)", [input.node.name])
}
"#;

/// A Deny policy blocks the step before it runs: the task is Blocked with reason
/// PolicyDenied and the policy's message in the task and Operation status, the step
/// status records the decision with the policy-set digest, and a PolicyDenied Event is
/// published. Fixing the policy's data and setting `recovery: Retry` lets the step run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_policy_blocks_the_step_and_retry_after_the_fix_succeeds() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let cp = control_plane(&lab)?;
    let mut operator = setup(&lab, "policy-deny").await?;
    let policy = format!("{}-hold", operator.instance);
    apply_policy(
        &operator,
        &policy,
        "Deny",
        DENY_HELLO,
        json!({ "e2e": { "hold_hello": true } }),
    )
    .await?;
    let p = wait_policy(&operator.client, &policy, |p| {
        p.status.as_ref().is_some_and(|s| s.compiled)
    })
    .await?;
    let digest = p
        .status
        .as_ref()
        .and_then(|s| s.digest.clone())
        .unwrap_or_default();
    ensure!(
        digest.starts_with("sha256:"),
        "Policy status digest {digest:?}"
    );

    let name = operator
        .create_operation("policy-deny", greet_control_plane())
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
    let expected = format!("hello is on hold on {cp} (e2e)");
    assert!(message.contains(&expected), "Operation message: {message}");
    let blocked = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Blocked")
        .context("no Blocked condition")?;
    assert_eq!(
        (blocked.status.as_str(), blocked.reason.as_str()),
        ("True", "PolicyDenied")
    );

    let task = operator.task(&name, &cp).await?;
    let ts = task.status.clone().unwrap_or_default();
    assert_eq!(
        (ts.phase, ts.reason),
        (NodeTaskPhase::Blocked, Some(BlockReason::PolicyDenied))
    );
    assert!(
        ts.message.as_deref().unwrap_or("").contains(&expected),
        "task message: {:?}",
        ts.message
    );
    let greet = greet_status(&task)?;
    assert_eq!(greet.phase, StepPhase::Failed);
    assert_eq!(
        greet.error.as_ref().map(|e| e.code.as_str()),
        Some("policy-denied")
    );
    assert!(
        greet
            .log_tail
            .iter()
            .all(|l| !l.contains("greeting the node")),
        "the plugin must not have run: {:?}",
        greet.log_tail
    );
    let decision = greet
        .policy
        .clone()
        .context("no policy decision in the step status")?;
    assert!(!decision.allowed);
    assert_eq!(decision.messages.len(), 1, "{:?}", decision.messages);
    assert_eq!(
        (
            decision.messages[0].policy.as_str(),
            decision.messages[0].enforcement
        ),
        (policy.as_str(), Enforcement::Deny)
    );
    assert_eq!(decision.messages[0].message, expected);
    let set_digest = decision.policy_set_digest.clone().unwrap_or_default();
    assert!(set_digest.starts_with("sha256:"), "{set_digest:?}");
    // The decision's input is recorded, and replays offline to the same deny
    // (troubleshooting.md: save it, then `kubectl bosun policy eval --input`).
    let input = decision
        .input
        .clone()
        .context("no input recorded with the denied step's policy decision")?;
    let replay = std::env::temp_dir().join(bosun_e2e::unique("policy-replay"));
    std::fs::create_dir_all(&replay)?;
    let input_file = replay.join("input.json");
    std::fs::write(&input_file, serde_json::to_vec_pretty(&input)?)?;
    let manifest = replay.join("policy.json");
    let policy_doc = json!({
        "apiVersion": "bosun.dev/v1alpha1", "kind": "Policy", "metadata": { "name": policy },
        "spec": { "rego": DENY_HELLO, "data": { "e2e": { "hold_hello": true } }, "enforcement": "Deny" },
    });
    std::fs::write(&manifest, serde_json::to_vec(&policy_doc)?)?;
    let out = std::process::Command::new(bosun_e2e::binary("kubectl-bosun")?)
        .args(["policy", "eval", "-o", "json", "--input"])
        .arg(&input_file)
        .arg("--policy")
        .arg(&manifest)
        .output()?;
    std::fs::remove_dir_all(&replay)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "the replay denies: {stderr}");
    let explained: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(explained["decision"]["point"], json!("step"), "{explained}");
    assert_eq!(
        explained["decision"]["denies"][0]["message"],
        json!(expected),
        "{explained}"
    );
    // The plugin's preflight ran before the gate, and the agent's built-in checks passed.
    assert!(
        greet.preflight.iter().any(|c| c.name == "file-readable"),
        "{:?}",
        greet.preflight
    );
    for check in [
        "agent/disk-space",
        "agent/host-binaries",
        "agent/node-ready",
        "agent/kubelet-skew",
    ] {
        assert!(
            greet.preflight.iter().any(|c| c.name == check),
            "{check} missing from {:?}",
            greet.preflight
        );
    }
    let events = events_about(&operator.client, &task.name_any(), Some("PolicyDenied")).await?;
    ensure!(
        events
            .iter()
            .any(|e| e.note.as_deref().unwrap_or("").contains(&expected)),
        "no PolicyDenied Event with the message for {}: {events:?}",
        task.name_any()
    );

    // The fix: the policy's data no longer holds hello; then a person retries.
    apply_policy(
        &operator,
        &policy,
        "Deny",
        DENY_HELLO,
        json!({ "e2e": { "hold_hello": false } }),
    )
    .await?;
    wait_policy(&operator.client, &policy, |p| {
        p.status.as_ref().is_some_and(|s| s.compiled)
    })
    .await?;
    operator
        .patch_task_spec(&task.name_any(), json!({ "recovery": "Retry" }))
        .await?;
    let op = operator
        .wait_operation(
            &name,
            "phase Succeeded after the fix and recovery: Retry",
            |o| {
                o.status
                    .as_ref()
                    .is_some_and(|s| s.phase == OperationPhase::Succeeded)
            },
        )
        .await?;
    assert_eq!(
        op.status.unwrap_or_default().phase,
        OperationPhase::Succeeded
    );
    let greet = greet_status(&operator.task(&name, &cp).await?)?;
    assert_eq!(greet.phase, StepPhase::Succeeded);
    assert!(greet.attempts >= 2, "the step ran again: {greet:?}");
    let decision = greet.policy.context("no policy decision after the retry")?;
    assert!(
        decision.allowed && decision.messages.is_empty(),
        "{decision:?}"
    );
    assert_ne!(
        decision.policy_set_digest.as_deref(),
        Some(set_digest.as_str()),
        "the fixed set is a new generation"
    );

    delete_policy(&operator.client, &policy).await?;
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

/// A Warn policy's message is recorded in the step status (and as a PolicyWarning Event)
/// and the step runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warn_policy_records_its_message_and_the_step_proceeds() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let cp = control_plane(&lab)?;
    let mut operator = setup(&lab, "policy-warn").await?;
    let policy = format!("{}-warn", operator.instance);
    apply_policy(
        &operator,
        &policy,
        "Warn",
        DENY_HELLO,
        json!({ "e2e": { "hold_hello": true } }),
    )
    .await?;
    wait_policy(&operator.client, &policy, |p| {
        p.status.as_ref().is_some_and(|s| s.compiled)
    })
    .await?;

    let name = operator
        .create_operation("policy-warn", greet_control_plane())
        .await?;
    let op = operator.wait_settled(&name).await?;
    let status = op.status.clone().unwrap_or_default();
    assert_eq!(
        status.phase,
        OperationPhase::Succeeded,
        "{:?}",
        status.message
    );
    let task = operator.task(&name, &cp).await?;
    let greet = greet_status(&task)?;
    assert_eq!(greet.phase, StepPhase::Succeeded);
    assert!(
        greet
            .log_tail
            .iter()
            .any(|l| l.contains("greeting the node as e2e")),
        "{:?}",
        greet.log_tail
    );
    let decision = greet
        .policy
        .context("no policy decision in the step status")?;
    assert!(decision.allowed);
    assert_eq!(decision.messages.len(), 1, "{:?}", decision.messages);
    assert_eq!(decision.messages[0].enforcement, Enforcement::Warn);
    assert_eq!(
        decision.messages[0].message,
        format!("hello is on hold on {cp} (e2e)")
    );
    let events = events_about(&operator.client, &task.name_any(), Some("PolicyWarning")).await?;
    ensure!(
        !events.is_empty(),
        "no PolicyWarning Event for {}",
        task.name_any()
    );

    delete_policy(&operator.client, &policy).await?;
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

/// A policy that does not compile blocks rather than allows, even with enforcement Audit:
/// its status shows the error with line and column, the Operation is Blocked before
/// anything is planned (no NodeTask exists), and deleting the policy lets it run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_policy_blocks_instead_of_allowing() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let mut operator = setup(&lab, "policy-broken").await?;
    let policy = format!("{}-broken", operator.instance);
    let rego = "package bosun.step.e2e_broken\n\ndeny contains msg if {\n\tmsg := sprintf(\"unclosed %s\", [input.node.name]\n}\n";
    apply_policy(&operator, &policy, "Audit", rego, json!({})).await?;
    let p = wait_policy(&operator.client, &policy, |p| p.status.is_some()).await?;
    let ps = p.status.clone().unwrap_or_default();
    assert!(!ps.compiled, "{ps:?}");
    assert_eq!(ps.errors.len(), 1, "{:?}", ps.errors);
    let error = &ps.errors[0];
    let prefix = format!("{policy}:");
    let location: Vec<&str> = error
        .strip_prefix(&prefix)
        .unwrap_or("")
        .splitn(3, ':')
        .collect();
    ensure!(
        location.len() == 3
            && location[0].parse::<u32>().is_ok()
            && location[1].parse::<u32>().is_ok(),
        "expected `{policy}:LINE:COLUMN: message`, found {error}"
    );
    let compiled = ps
        .conditions
        .iter()
        .find(|c| c.type_ == "Compiled")
        .context("no Compiled condition")?;
    assert_eq!(
        (compiled.status.as_str(), compiled.reason.as_str()),
        ("False", "CompileFailed")
    );

    let name = operator
        .create_operation("policy-broken", greet_control_plane())
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
        message.contains("policy is broken") && message.contains(&policy),
        "{message}"
    );
    let blocked = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Blocked")
        .context("no Blocked condition")?;
    assert_eq!(blocked.reason, "PolicyDenied");
    assert!(
        status.plan.is_none(),
        "nothing may be planned while a policy is broken"
    );
    assert!(
        operator.tasks(&name).await?.is_empty(),
        "no NodeTask may exist while a policy is broken"
    );
    let events = events_about(&operator.client, &name, Some("PolicyDenied")).await?;
    ensure!(
        !events.is_empty(),
        "no PolicyDenied Event for Operation {name}"
    );

    // Deleting the broken policy unblocks the Operation (no recovery needed: nothing ran).
    delete_policy(&operator.client, &policy).await?;
    let op = operator
        .wait_operation(
            &name,
            "phase Succeeded after the broken policy was deleted",
            |o| {
                o.status
                    .as_ref()
                    .is_some_and(|s| s.phase == OperationPhase::Succeeded)
            },
        )
        .await?;
    assert_eq!(
        op.status.unwrap_or_default().phase,
        OperationPhase::Succeeded
    );
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}

/// An operation policy that holds back one group: the Operation runs its first group,
/// then stops Blocked (PolicyDenied) before the held group's first task starts; deleting
/// the policy lets the rest run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_policy_holds_a_group_before_it_starts() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    let cp = control_plane(&lab)?;
    let mut operator = setup(&lab, "policy-group").await?;
    let policy = format!("{}-no-workers", operator.instance);
    let rego = r#"package bosun.operation.e2e_no_workers

deny contains msg if {
	input.nextGroup == "workers"
	msg := sprintf("workers of %s wait for the change board (e2e)", [input.operation.name])
}
"#;
    apply_policy(&operator, &policy, "Deny", rego, json!({})).await?;
    wait_policy(&operator.client, &policy, |p| {
        p.status.as_ref().is_some_and(|s| s.compiled)
    })
    .await?;

    let name = operator
        .create_operation("policy-group", json!({
            "custom": { "groups": [
                { "name": "control-plane",
                  "nodeSelector": { "matchExpressions": [{ "key": "node-role.kubernetes.io/control-plane", "operator": "Exists" }] },
                  "steps": [{ "name": "greet", "plugin": "hello", "action": "greet", "params": { "name": "e2e" } }] },
                { "name": "workers",
                  "steps": [{ "name": "greet", "plugin": "hello", "action": "greet", "params": { "name": "e2e" } }] } ] },
            "rollout": { "maxUnavailable": 3 },
        }))
        .await?;
    let expected = format!("workers of {name} wait for the change board (e2e)");
    let op = operator
        .wait_operation(
            &name,
            "Blocked by the operation policy before the workers group",
            |o| {
                o.status.as_ref().is_some_and(|s| {
                    s.phase == OperationPhase::Blocked
                        && s.message
                            .as_deref()
                            .unwrap_or("")
                            .contains("before group workers")
                })
            },
        )
        .await?;
    let status = op.status.clone().unwrap_or_default();
    assert!(
        status.message.as_deref().unwrap_or("").contains(&expected),
        "{:?}",
        status.message
    );
    let blocked = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Blocked")
        .context("no Blocked condition")?;
    assert_eq!(
        (blocked.status.as_str(), blocked.reason.as_str()),
        ("True", "PolicyDenied")
    );
    let tasks = operator.tasks(&name).await?;
    let phase = |t: &NodeTask| t.status.as_ref().map(|s| s.phase).unwrap_or_default();
    assert_eq!(
        phase(&tasks[&cp]),
        NodeTaskPhase::Succeeded,
        "the first group ran"
    );
    for (node, t) in tasks.iter().filter(|(n, _)| **n != cp) {
        assert_eq!(
            phase(t),
            NodeTaskPhase::Pending,
            "{node} must not start while its group is held"
        );
    }
    let events = events_about(&operator.client, &name, Some("PolicyDenied")).await?;
    ensure!(
        events
            .iter()
            .any(|e| e.note.as_deref().unwrap_or("").contains(&expected)),
        "no PolicyDenied Event: {events:?}"
    );

    delete_policy(&operator.client, &policy).await?;
    let op = operator
        .wait_operation(&name, "phase Succeeded once the policy is gone", |o| {
            o.status
                .as_ref()
                .is_some_and(|s| s.phase == OperationPhase::Succeeded)
        })
        .await?;
    assert_eq!(
        op.status.unwrap_or_default().phase,
        OperationPhase::Succeeded
    );
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}
