//! What the agent refuses before a plugin runs, end to end: the real controller and one
//! real agent per lab node (through `bosun_e2e::Operator`) run a one-step Operation that
//! greets the control-plane node with the signed `hello` plugin, and each test breaks one
//! thing the agent checks:
//!
//! - the Plugin grants less than the plugin's `describe()` requests (requested ⊆ granted,
//!   checked in the agent's capabilities gate): the task blocks with PolicyDenied, error
//!   code `capabilities-denied`, the uncovered request named, and nothing of the plugin ran;
//! - a `bosun.capabilities` Policy denies: the same block, with the policy's message;
//! - the Plugin's signature is made by a key the agent does not trust: the task blocks with
//!   PluginUnavailable, code `plugin-refused`, "refused before compiling", and the agent's
//!   compiled-code cache stays empty (nothing was compiled);
//! - the ConfigMap's bytes do not hash to the pinned sha256: PluginUnavailable, code
//!   `plugin-unavailable`, both digests named, and neither the store nor the compiled-code
//!   cache holds anything.
//!
//! Each test then fixes the cause, sets `recovery: Retry`, and the Operation succeeds, so
//! each refusal is shown to be about the one thing the test broke.
//!
//! The tests change the shared `hello` Plugin and its ConfigMap, so each holds
//! `bosun_e2e::lock_lab_nodes` (tests of this binary run one at a time) and re-publishes
//! `hello` correctly before it returns; other test binaries re-publish it before use.
//! Build the binaries first: `cargo build -p bosun-controller -p bosun-agent`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bosun_api::node_task::{BlockReason, NodeTask, NodeTaskPhase, StepPhase, StepStatus};
use bosun_api::operation::OperationPhase;
use bosun_api::plugin::Plugin;
use bosun_api::policy::Policy;
use bosun_e2e::cluster::PLUGIN_NAMESPACE;
use bosun_e2e::operator::{INSTANCE_LABEL, phase_of};
use bosun_e2e::{MANAGER, Operator, target_dir, unique};
use bosun_lab::{LabHandle, Role};
use bosun_trust::{Digest, SigningKey, Statement};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// The control-plane node of the lab.
fn control_plane(lab: &LabHandle) -> Result<String> {
    lab.nodes
        .iter()
        .find(|n| n.role == Role::ControlPlane)
        .map(|n| n.name.clone())
        .context("the lab has no control-plane node")
}

/// An Operation greeting only the control-plane node.
fn greet_control_plane() -> serde_json::Value {
    json!({ "custom": { "groups": [
        { "name": "control-plane",
          "nodeSelector": { "matchExpressions": [
              { "key": "node-role.kubernetes.io/control-plane", "operator": "Exists" }] },
          "steps": [{ "name": "greet", "plugin": "hello", "action": "greet",
                      "params": { "name": "trust" } }] } ] } })
}

/// A directory of this test run (compiled-code cache, keys).
fn run_dir(test: &str) -> Result<PathBuf> {
    let dir = target_dir().join("e2e-trust").join(unique(test));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// An operator whose agents share the compiled-code cache `cache` (`--cache-dir`): a file
/// appears there for every plugin an agent compiled.
fn operator_with_cache(lab: &LabHandle, test: &str, cache: &Path) -> Result<Operator> {
    Operator::start_with_agent_args(
        lab,
        test,
        &["--cache-dir".to_string(), cache.display().to_string()],
    )
}

/// The greet step's status in `task` (also for `backends`).
pub(crate) fn greet(task: &NodeTask) -> Result<StepStatus> {
    task.status
        .as_ref()
        .and_then(|s| s.steps.iter().find(|s| s.name == "greet"))
        .cloned()
        .with_context(|| format!("no greet step status in {:?}", task.status))
}

/// Waits for the Operation to settle Blocked and returns the control-plane task, checked
/// to be Blocked for `reason` with a failed greet step whose error has `code`.
async fn blocked_task(
    operator: &mut Operator,
    op: &str,
    node: &str,
    reason: BlockReason,
    code: &str,
) -> Result<(NodeTask, StepStatus)> {
    let settled = operator.wait_settled(op).await?;
    ensure!(
        phase_of(&settled) == OperationPhase::Blocked,
        "Operation {op} settled {:?}, expected Blocked: {}",
        phase_of(&settled),
        bosun_e2e::describe_tasks(&operator.client, op).await
    );
    let task = operator.task(op, node).await?;
    let status = task.status.clone().unwrap_or_default();
    ensure!(
        (status.phase, status.reason) == (NodeTaskPhase::Blocked, Some(reason)),
        "task of {node} is {:?} ({:?}), expected Blocked ({reason:?}): {:?}",
        status.phase,
        status.reason,
        status.message
    );
    let step = greet(&task)?;
    ensure!(
        step.phase == StepPhase::Failed,
        "greet is {:?}, expected Failed",
        step.phase
    );
    let error = step
        .error
        .clone()
        .context("a failed greet step without an error")?;
    ensure!(
        error.code == code,
        "greet failed with code {:?}, expected {code:?}: {}",
        error.code,
        error.message
    );
    Ok((task, step))
}

/// Nothing of the plugin ran: no check of its preflight, no outputs, no log lines.
fn nothing_ran(step: &StepStatus) -> Result<()> {
    ensure!(
        !step.preflight.iter().any(|c| c.name == "file-readable"),
        "hello's preflight ran: {:?}",
        step.preflight
    );
    ensure!(
        step.outputs.is_empty() && step.log_tail.is_empty(),
        "hello ran: outputs {:?}, log {:?}",
        step.outputs,
        step.log_tail
    );
    Ok(())
}

/// Sets `recovery: Retry` on `node`'s task and waits until the greet step ran again (its
/// attempts went up) and finished; returns the task then. (Waiting on the step's attempts
/// rather than on the Operation leaving Blocked: a retry refused again may leave and
/// re-enter Blocked between two polls.)
pub(crate) async fn retry(operator: &mut Operator, op: &str, node: &str) -> Result<NodeTask> {
    let task = operator.task(op, node).await?;
    let before = greet(&task)?.attempts;
    operator
        .patch_task_spec(&task.name_any(), json!({ "recovery": "Retry" }))
        .await?;
    operator
        .wait_task(op, node, "greet ran again and finished", |t| {
            greet(t).is_ok_and(|s| {
                s.attempts > before && matches!(s.phase, StepPhase::Succeeded | StepPhase::Failed)
            })
        })
        .await
}

/// [`retry`], then the task and the Operation must succeed.
async fn retry_succeeds(operator: &mut Operator, op: &str, node: &str) -> Result<()> {
    let task = retry(operator, op, node).await?;
    let step = greet(&task)?;
    ensure!(
        step.phase == StepPhase::Succeeded,
        "after the fix, the retried greet is {:?}: {:?}",
        step.phase,
        step.error
    );
    operator
        .wait_operation(op, "Succeeded", |o| {
            phase_of(o) == OperationPhase::Succeeded
        })
        .await?;
    Ok(())
}

/// The `.cwasm` files of the compiled-code cache `cache` (one per plugin compiled).
fn compiled(cache: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    if !cache.exists() {
        return Ok(out);
    }
    for entry in std::fs::read_dir(cache).with_context(|| format!("reading {}", cache.display()))? {
        let name = entry?.file_name().to_string_lossy().to_string();
        if name.ends_with(".cwasm") {
            out.push(name);
        }
    }
    Ok(out)
}

/// A Plugin whose grants leave out the `uname -r` it requests is refused by the agent's
/// capabilities gate once the plugin is loaded, before any call into it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_requesting_more_than_its_grants_is_blocked_before_it_runs() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    bosun_e2e::apply_crds(&lab.client).await?;
    bosun_e2e::cluster::publish_hello(&lab).await?;
    let cp = control_plane(&lab)?;
    let wasm = bosun_e2e::build_plugin("bosun-plugin-hello")?;
    // Everything but the exec grant: hello still asks for `/usr/bin/uname -r`.
    let narrow = json!({ "filesystem": [{ "path": "/etc", "access": "ReadOnly" }] });
    bosun_e2e::publish_plugin(&lab.client, "hello", "0.1.0", wasm, narrow).await?;
    let mut operator = Operator::start(&lab, "caps-grants")?;

    let op = operator
        .create_operation("caps-grants", greet_control_plane())
        .await?;
    let (task, step) = blocked_task(
        &mut operator,
        &op,
        &cp,
        BlockReason::PolicyDenied,
        "capabilities-denied",
    )
    .await?;
    let uncovered = "exec: /usr/bin/uname -r is requested but no exec grant for that command allows those arguments";
    let message = task
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default();
    for text in ["the plugin's capabilities were denied by policy", uncovered] {
        ensure!(
            message.contains(text),
            "task message lacks {text:?}: {message}"
        );
    }
    let decision = step
        .policy
        .clone()
        .context("the step status records no policy decision")?;
    ensure!(
        !decision.allowed,
        "the recorded decision allows the step: {decision:?}"
    );
    ensure!(
        decision
            .messages
            .iter()
            .any(|m| m.policy == "bosun" && m.message == uncovered),
        "the decision does not name the uncovered request as policy bosun's: {decision:?}"
    );
    nothing_ran(&step)?;

    // The grant an administrator adds: the same step now runs.
    bosun_e2e::cluster::publish_hello(&lab).await?;
    retry_succeeds(&mut operator, &op, &cp).await?;
    operator.finish().await?;
    Ok(())
}

const DENY_UNAME: &str = r#"package bosun.capabilities.e2e_no_uname

deny contains msg if {
	input.plugin.name == "hello"
	some r in input.requested.exec
	r.command == "/usr/bin/uname"
	msg := sprintf("no uname on %s (e2e)", [input.node])
}
"#;

/// A `bosun.capabilities` Policy that denies blocks the step even though every request is
/// granted; deleting the Policy and retrying lets it run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capabilities_policy_that_denies_blocks_the_step() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    bosun_e2e::apply_crds(&lab.client).await?;
    bosun_e2e::cluster::publish_hello(&lab).await?;
    let cp = control_plane(&lab)?;
    let mut operator = Operator::start(&lab, "caps-policy")?;
    let policies: Api<Policy> = Api::all(operator.client.clone());
    let policy = format!("{}-no-uname", operator.instance);
    policies
        .patch(
            &policy,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(json!({
                "apiVersion": "bosun.dev/v1alpha1", "kind": "Policy",
                "metadata": { "name": policy, "labels": { INSTANCE_LABEL: operator.instance } },
                "spec": { "rego": DENY_UNAME, "enforcement": "Deny" },
            })),
        )
        .await
        .with_context(|| format!("applying Policy {policy}"))?;
    wait_compiled(&policies, &policy).await?;

    let op = operator
        .create_operation("caps-policy", greet_control_plane())
        .await?;
    let (task, step) = blocked_task(
        &mut operator,
        &op,
        &cp,
        BlockReason::PolicyDenied,
        "capabilities-denied",
    )
    .await?;
    let expected = format!("no uname on {cp} (e2e)");
    let message = task
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default();
    for text in ["the plugin's capabilities were denied by policy", &expected] {
        ensure!(
            message.contains(text),
            "task message lacks {text:?}: {message}"
        );
    }
    let decision = step
        .policy
        .clone()
        .context("the step status records no policy decision")?;
    ensure!(
        !decision.allowed && decision.messages.iter().any(|m| m.message == expected),
        "the recorded decision does not carry the policy's deny: {decision:?}"
    );
    ensure!(
        !decision.messages.iter().any(|m| m.policy == "bosun"),
        "every request is granted, yet the subset check refused one: {decision:?}"
    );
    nothing_ran(&step)?;

    policies
        .delete(&policy, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting Policy {policy}"))?;
    // The agent's policy set follows the Policy watch; retrying before it dropped the
    // Policy would be refused again. Wait until the controller (same watch) stops listing it.
    wait_gone(&policies, &policy).await?;
    retry_succeeds_eventually(&mut operator, &op, &cp).await?;
    operator.finish().await?;
    Ok(())
}

/// Waits until the controller reports Policy `name` compiled for its current generation.
async fn wait_compiled(policies: &Api<Policy>, name: &str) -> Result<()> {
    let started = Instant::now();
    loop {
        let p = policies
            .get(name)
            .await
            .with_context(|| format!("getting Policy {name}"))?;
        let status = p.status.clone().unwrap_or_default();
        if status.observed_generation == p.metadata.generation && status.compiled {
            return Ok(());
        }
        if started.elapsed() >= bosun_e2e::DEADLINE {
            bail!("Policy {name} was not reported compiled within the deadline: {status:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits until Policy `name` is gone from the API server.
async fn wait_gone(policies: &Api<Policy>, name: &str) -> Result<()> {
    let started = Instant::now();
    while policies.get_opt(name).await?.is_some() {
        if started.elapsed() >= bosun_e2e::DEADLINE {
            bail!("Policy {name} still exists after its deletion");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// [`retry_succeeds`], except that a retry the agent refused again for the same reason
/// (its Policy watch had not yet delivered the deletion) is retried until the deadline.
async fn retry_succeeds_eventually(operator: &mut Operator, op: &str, node: &str) -> Result<()> {
    let started = Instant::now();
    loop {
        let task = retry(operator, op, node).await?;
        let step = greet(&task)?;
        if step.phase == StepPhase::Succeeded {
            break;
        }
        let code = step.error.as_ref().map(|e| e.code.as_str());
        ensure!(
            code == Some("capabilities-denied"),
            "the retried greet failed otherwise than refused by the deleted Policy: {:?}",
            step.error
        );
        if started.elapsed() >= bosun_e2e::DEADLINE {
            bail!(
                "the deleted Policy still denied the step after {:?}",
                bosun_e2e::DEADLINE
            );
        }
    }
    operator
        .wait_operation(op, "Succeeded", |o| {
            phase_of(o) == OperationPhase::Succeeded
        })
        .await?;
    Ok(())
}

/// The hello Plugin as `publish_hello` wrote it, with its signatures replaced by one made
/// with `key` over the same statement (name, version, digest).
async fn resign_hello(lab: &LabHandle, wasm: &[u8], key: &SigningKey) -> Result<()> {
    let plugins: Api<Plugin> = Api::all(lab.client.clone());
    let mut plugin = plugins.get("hello").await.context("reading Plugin hello")?;
    let signature = key.sign_statement(&Statement::new("hello", "0.1.0", Digest::of(wasm))?);
    plugin.spec.signatures = serde_json::from_value(json!([{
        "algorithm": "ed25519", "keyId": signature.key_id, "signature": signature.signature,
    }]))?;
    let params = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    plugins
        .replace("hello", &params, &plugin)
        .await
        .context("replacing Plugin hello's signatures")?;
    Ok(())
}

/// A Plugin signed by a key that is not among the agent's trust roots is refused when the
/// host loads it: before compiling (the compiled-code cache stays empty), the task Blocked
/// with PluginUnavailable and the host's "not signed by a trusted key".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_signed_by_an_untrusted_key_is_refused_before_compiling() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    bosun_e2e::apply_crds(&lab.client).await?;
    bosun_e2e::cluster::publish_hello(&lab).await?;
    let cp = control_plane(&lab)?;
    let wasm = bosun_e2e::build_plugin("bosun-plugin-hello")?;
    let digest = Digest::of(&wasm);
    // The same bytes and statement, signed by a key only this test knows.
    let stranger = SigningKey::generate_ed25519();
    resign_hello(&lab, &wasm, &stranger).await?;
    let dir = run_dir("untrusted")?;
    let cache = dir.join("compiled");
    let mut operator = operator_with_cache(&lab, "untrusted", &cache)?;

    let op = operator
        .create_operation("untrusted", greet_control_plane())
        .await?;
    let (task, step) = blocked_task(
        &mut operator,
        &op,
        &cp,
        BlockReason::PluginUnavailable,
        "plugin-refused",
    )
    .await?;
    let message = task
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default();
    for text in [
        "plugin hello 0.1.0 refused before compiling".to_string(),
        format!("({digest}) is not signed by a trusted key"),
    ] {
        ensure!(
            message.contains(&text),
            "task message lacks {text:?}: {message}"
        );
    }
    nothing_ran(&step)?;
    let code = compiled(&cache)?;
    ensure!(
        code.is_empty(),
        "the untrusted plugin was compiled: {code:?} in {}",
        cache.display()
    );

    // Signed again with the trusted key: the retry compiles (the cache now holds the code,
    // so an empty cache above meant "not compiled") and runs it.
    bosun_e2e::cluster::publish_hello(&lab).await?;
    retry_succeeds(&mut operator, &op, &cp).await?;
    ensure!(
        !compiled(&cache)?.is_empty(),
        "the trusted plugin ran but left no compiled code in {}",
        cache.display()
    );
    operator.finish().await?;
    Ok(())
}

/// Bytes in the Plugin's ConfigMap that do not hash to its pinned sha256 are refused by the
/// agent as it fetches them: neither stored nor compiled, the task Blocked with
/// PluginUnavailable naming both digests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_bytes_that_do_not_match_the_pinned_digest_are_refused_before_compiling()
-> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    bosun_e2e::apply_crds(&lab.client).await?;
    bosun_e2e::cluster::publish_hello(&lab).await?;
    let cp = control_plane(&lab)?;
    let wasm = bosun_e2e::build_plugin("bosun-plugin-hello")?;
    // Another valid, trusted-signed component in hello's ConfigMap: only the pin tells.
    let other = bosun_e2e::build_plugin("bosun-test-steps")?;
    let (pinned, found) = (Digest::of(&wasm), Digest::of(&other));
    let maps: Api<ConfigMap> = Api::namespaced(lab.client.clone(), PLUGIN_NAMESPACE);
    let swap = |bytes: Vec<u8>| ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("plugin-hello".into()),
            ..Default::default()
        },
        binary_data: Some(BTreeMap::from([(
            "hello.wasm".to_string(),
            ByteString(bytes),
        )])),
        ..Default::default()
    };
    maps.patch(
        "plugin-hello",
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&swap(other)),
    )
    .await
    .context("putting other bytes in hello's ConfigMap")?;
    let dir = run_dir("digest")?;
    let cache = dir.join("compiled");
    let mut operator = operator_with_cache(&lab, "digest", &cache)?;

    let op = operator
        .create_operation("digest", greet_control_plane())
        .await?;
    let (task, step) = blocked_task(
        &mut operator,
        &op,
        &cp,
        BlockReason::PluginUnavailable,
        "plugin-unavailable",
    )
    .await?;
    let message = task
        .status
        .as_ref()
        .and_then(|s| s.message.clone())
        .unwrap_or_default();
    let expected = format!(
        "Plugin hello bytes from ConfigMap {PLUGIN_NAMESPACE}/plugin-hello key hello.wasm hash to {found}, but {pinned} is pinned"
    );
    ensure!(
        message.contains(&expected),
        "task message lacks {expected:?}: {message}"
    );
    nothing_ran(&step)?;
    let store = operator.dir.join(format!("plugins-{cp}"));
    for digest in [pinned, found] {
        let path = store.join(format!("{}.wasm", digest.to_hex()));
        ensure!(!path.exists(), "{} was stored", path.display());
    }
    let code = compiled(&cache)?;
    ensure!(
        code.is_empty(),
        "plugin code was compiled: {code:?} in {}",
        cache.display()
    );

    maps.patch(
        "plugin-hello",
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(&swap(wasm)),
    )
    .await
    .context("restoring hello's ConfigMap")?;
    retry_succeeds(&mut operator, &op, &cp).await?;
    ensure!(
        store.join(format!("{}.wasm", pinned.to_hex())).exists(),
        "the signed bytes ran but are not in the store {}",
        store.display()
    );
    operator.finish().await?;
    Ok(())
}
