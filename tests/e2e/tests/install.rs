//! The install path against the lab's real API server: what `deploy/` creates, what the
//! agent's identity may and may not do, and what the admin servers expose.
//!
//! - `kubectl apply --dry-run=server -k deploy/` is accepted by the API server (schema,
//!   admission, RBAC escalation checks — everything but persisting).
//! - The agent's RBAC and the `bosun-agent-own-node` ValidatingAdmissionPolicy: a token
//!   bound to a Pod on node A may write node A's NodeTask status and is refused node B's
//!   with the policy's message; a token bound to no Pod is refused; RBAC refuses deleting
//!   NodeTasks, changing their spec, and writing Operations.
//! - A controller and an agent running as deploy/'s ServiceAccounts (RBAC and admission
//!   policy in force) carry out a real Operation without a refused call, and their
//!   `/metrics` show every metric family with exact counts for that Operation.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bosun_api::node_task::NodeTask;
use bosun_api::operation::{Operation, OperationPhase};
use bosun_e2e::admin::{free_port, get, request};
use bosun_e2e::cluster::publish_hello;
use bosun_e2e::identity::{agent_pod, client_with_token, kubectl, token_kubeconfig, token_of};
use bosun_e2e::{DEADLINE, MANAGER, Processes, apply_crds, binary, target_dir, unique};
use bosun_lab::LabHandle;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde::Deserialize as _;
use serde_json::json;

const NAMESPACE: &str = "bosun-system";
const AGENT_SA: &str = "bosun-agent";
const POLICY: &str = "bosun-agent-own-node";
const POLL: Duration = Duration::from_millis(250);

/// The namespace `deploy/` installs into. A server-side dry run creates nothing, so the
/// namespaced objects of the same dry run would be refused with "namespaces not found" on
/// a cluster that never had it; this makes the dry run about the manifests, not the order.
async fn ensure_namespace(client: &Client) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(NAMESPACE, &PatchParams::apply(MANAGER), &Patch::Apply(json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": NAMESPACE } })))
        .await
        .context("creating the bosun-system namespace")?;
    Ok(())
}

#[tokio::test]
async fn deploy_kustomization_passes_a_server_side_dry_run() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    ensure_namespace(&lab.client).await?;
    let out = kubectl(&lab, &["apply", "--dry-run=server", "-k", "deploy/"])?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success(),
        "kubectl apply --dry-run=server -k deploy/ failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // Every object the kustomization renders was accepted (created, configured or
    // unchanged, depending on what earlier runs left in the lab).
    for object in [
        "namespace/bosun-system",
        "customresourcedefinition.apiextensions.k8s.io/operations.bosun.dev",
        "customresourcedefinition.apiextensions.k8s.io/nodetasks.bosun.dev",
        "customresourcedefinition.apiextensions.k8s.io/plugins.bosun.dev",
        "customresourcedefinition.apiextensions.k8s.io/policies.bosun.dev",
        "serviceaccount/bosun-controller",
        "serviceaccount/bosun-agent",
        "clusterrole.rbac.authorization.k8s.io/bosun-controller",
        "clusterrole.rbac.authorization.k8s.io/bosun-agent",
        "clusterrolebinding.rbac.authorization.k8s.io/bosun-controller",
        "clusterrolebinding.rbac.authorization.k8s.io/bosun-agent",
        "role.rbac.authorization.k8s.io/bosun-agent-plugins",
        "rolebinding.rbac.authorization.k8s.io/bosun-agent-plugins",
        "deployment.apps/bosun-controller",
        "daemonset.apps/bosun-agent",
        "service/bosun-controller-metrics",
        "service/bosun-agent-metrics",
        "poddisruptionbudget.policy/bosun-controller",
        "validatingadmissionpolicy.admissionregistration.k8s.io/bosun-agent-own-node",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/bosun-agent-own-node",
        "validatingadmissionpolicy.admissionregistration.k8s.io/bosun-clusterlifecycle-warnings",
        "validatingadmissionpolicy.admissionregistration.k8s.io/bosun-lifecycle-labels",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/bosun-lifecycle-labels",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/bosun-clusterlifecycle-warnings",
    ] {
        let accepted = stdout
            .lines()
            .any(|l| l.starts_with(&format!("{object} ")) && l.ends_with("(server dry run)"));
        ensure!(
            accepted,
            "{object} missing from the dry run's output:\n{stdout}\n{stderr}"
        );
    }
    Ok(())
}

/// A token of the agent's ServiceAccount (see [`token_of`]).
async fn agent_token(client: &Client, pod: Option<&Pod>) -> Result<String> {
    token_of(client, AGENT_SA, pod).await
}

/// Applies one of `deploy/`'s files for real (kubectl, as an administrator would).
fn apply_file(lab: &LabHandle, file: &str) -> Result<()> {
    let out = kubectl(
        lab,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager",
            MANAGER,
            "-f",
            file,
        ],
    )?;
    ensure!(
        out.status.success(),
        "kubectl apply -f {file} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The agent writing step status the way it does (server-side apply on the status
/// subresource, forced, its own field manager).
async fn write_status_as_agent(
    agent: &Client,
    task: &str,
) -> std::result::Result<NodeTask, kube::Error> {
    let api: Api<NodeTask> = Api::all(agent.clone());
    let patch = json!({ "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeTask", "metadata": { "name": task },
        "status": { "message": "written by the agent's token" } });
    api.patch_status(
        task,
        &PatchParams::apply("bosun-agent-install-test").force(),
        &Patch::Apply(&patch),
    )
    .await
}

fn forbidden(result: &std::result::Result<impl std::fmt::Debug, kube::Error>) -> Option<String> {
    match result {
        Err(kube::Error::Api(s)) if s.code == 403 => Some(s.message.clone()),
        _ => None,
    }
}

#[tokio::test]
async fn an_agent_may_write_only_its_own_nodes_node_tasks() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let client = lab.client.clone();
    apply_crds(&client).await?;
    ensure_namespace(&client).await?;
    apply_file(&lab, "deploy/agent/rbac.yaml")?;
    apply_file(&lab, "deploy/admission/agent-own-node.yaml")?;
    let [node_a, node_b] = [
        &lab.nodes[lab.nodes.len() - 2].name,
        &lab.nodes[lab.nodes.len() - 1].name,
    ];

    // The agent Pod on node A, as the DaemonSet would make it (spec.nodeName set; no
    // kubelet runs in the lab, so it never starts: only its identity matters here).
    let run = unique("install-rbac");
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pod = agent_pod(&client, &format!("agent-{run}"), node_a).await?;

    // One NodeTask per node, labelled with this run's instance so no agent of another test
    // acts on them.
    let tasks: Api<NodeTask> = Api::all(client.clone());
    let mut names = BTreeMap::new();
    for node in [node_a, node_b] {
        let name = format!("{run}-{node}");
        let task: NodeTask = serde_json::from_value(json!({
            "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeTask",
            "metadata": { "name": name, "labels": { "bosun.dev/node": node, "bosun.dev/instance": run } },
            "spec": { "operation": run, "nodeName": node, "group": "workers",
                      "steps": [{ "name": "greet", "plugin": "hello", "action": "greet" }] },
        }))?;
        tasks
            .create(&PostParams::default(), &task)
            .await
            .with_context(|| format!("creating NodeTask {name}"))?;
        names.insert(node.clone(), name);
    }

    let token = agent_token(&client, Some(&pod)).await?;
    let agent = client_with_token(&lab, &token).await?;

    // Node B's task: refused by the policy. The policy starts to apply once the API
    // server's admission informer has it, so wait for the refusal (RBAC allows the patch:
    // only the policy can refuse it) rather than assume it is immediate.
    let started = Instant::now();
    let refusal = loop {
        let result = write_status_as_agent(&agent, &names[node_b]).await;
        if let Some(message) = forbidden(&result) {
            break message;
        }
        ensure!(
            result.is_ok(),
            "writing node B's task status failed otherwise than refused: {result:?}"
        );
        if started.elapsed() >= DEADLINE {
            bail!(
                "within {DEADLINE:?} the API server never refused the agent of {node_a} writing {node_b}'s NodeTask; is the ValidatingAdmissionPolicy {POLICY} bound?"
            );
        }
        tokio::time::sleep(POLL).await;
    };
    ensure!(
        refusal.contains(&format!("ValidatingAdmissionPolicy '{POLICY}'")),
        "refused, but not by {POLICY}: {refusal}"
    );
    ensure!(
        refusal.contains(&format!(
            "bosun-agent on node {node_a} may change only NodeTasks of its own node"
        )) && refusal.contains(&format!("belongs to node {node_b}")),
        "the refusal does not say whose node it is: {refusal}"
    );

    // Node A's task: allowed, and the write landed.
    let written = write_status_as_agent(&agent, &names[node_a])
        .await
        .context("the agent of node A writing its own NodeTask's status")?;
    ensure!(
        written.status.as_ref().and_then(|s| s.message.as_deref())
            == Some("written by the agent's token"),
        "node A's status write did not land: {:?}",
        written.status
    );

    // A token of the same ServiceAccount bound to no Pod carries no node: refused.
    let unbound = client_with_token(&lab, &agent_token(&client, None).await?).await?;
    let result = write_status_as_agent(&unbound, &names[node_a]).await;
    let message = forbidden(&result)
        .with_context(|| format!("an unbound agent token wrote a NodeTask: {result:?}"))?;
    ensure!(
        message.contains("this token is not bound to a Pod on a node"),
        "unexpected refusal: {message}"
    );
    // A request with no extra user info at all (the administrator impersonating the
    // ServiceAccount): the same refusal, not a CEL error about a missing key.
    let kubeconfig = kube::config::Kubeconfig::read_from(&lab.kubeconfig)?;
    let mut config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{NAMESPACE}:{AGENT_SA}"));
    let impersonating = Client::try_from(config)?;
    // As above, the policy applies once the API server's admission informer has this
    // version of it: an earlier one (without the guard) answers 422 "no such key: extra".
    let started = Instant::now();
    loop {
        let result = write_status_as_agent(&impersonating, &names[node_a]).await;
        if forbidden(&result)
            .is_some_and(|m| m.contains("this token is not bound to a Pod on a node"))
        {
            break;
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "an impersonated request without extra user info was not refused with the policy's sentence within {DEADLINE:?}: {result:?}"
        );
        tokio::time::sleep(POLL).await;
    }

    // RBAC: no deleting NodeTasks, no spec changes, no writes to Operations.
    let agent_tasks: Api<NodeTask> = Api::all(agent.clone());
    let result = agent_tasks
        .delete(&names[node_a], &DeleteParams::default())
        .await;
    let message =
        forbidden(&result).with_context(|| format!("the agent deleted a NodeTask: {result:?}"))?;
    ensure!(
        message.contains("cannot delete resource \"nodetasks\""),
        "unexpected refusal: {message}"
    );
    let result = agent_tasks
        .patch(
            &names[node_a],
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "approve": true } })),
        )
        .await;
    let message = forbidden(&result)
        .with_context(|| format!("the agent changed a NodeTask's spec: {result:?}"))?;
    ensure!(
        message.contains("cannot patch resource \"nodetasks\""),
        "unexpected refusal: {message}"
    );
    let operations: Api<Operation> = Api::all(agent.clone());
    let op: Operation = serde_json::from_value(json!({
        "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation", "metadata": { "name": run },
        "spec": { "custom": { "groups": [{ "name": "g", "steps": [{ "name": "s", "plugin": "hello", "action": "greet" }] }] } },
    }))?;
    let result = operations.create(&PostParams::default(), &op).await;
    let message = forbidden(&result)
        .with_context(|| format!("the agent created an Operation: {result:?}"))?;
    ensure!(
        message.contains("cannot create resource \"operations\""),
        "unexpected refusal: {message}"
    );
    let result = operations.delete(&run, &DeleteParams::default()).await;
    let message = forbidden(&result)
        .with_context(|| format!("the agent deleted an Operation: {result:?}"))?;
    ensure!(
        message.contains("cannot delete resource \"operations\""),
        "unexpected refusal: {message}"
    );
    let result = operations
        .patch_status(
            &run,
            &PatchParams::apply("x").force(),
            &Patch::Apply(
                json!({ "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation", "status": {} }),
            ),
        )
        .await;
    let message = forbidden(&result)
        .with_context(|| format!("the agent wrote an Operation's status: {result:?}"))?;
    ensure!(
        message.contains("cannot patch resource \"operations/status\""),
        "unexpected refusal: {message}"
    );

    // Clean up what this test made (the NodeTasks are an audit trail only for real runs).
    for name in names.values() {
        tasks
            .delete(name, &DeleteParams::default())
            .await
            .with_context(|| format!("deleting NodeTask {name}"))?;
    }
    pods.delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
        .await
        .context("deleting the agent Pod")?;
    Ok(())
}

/// Waits until `/ready` on `port` answers 200, failing if a process exits first.
async fn wait_ready(procs: &mut Processes, port: u16, who: &str) -> Result<()> {
    let started = Instant::now();
    loop {
        procs.check_alive()?;
        if matches!(get(port, "/ready"), Ok((200, _))) {
            return Ok(());
        }
        if started.elapsed() >= DEADLINE {
            bail!(
                "{who}'s /ready on port {port} did not answer 200 within {DEADLINE:?}; logs in {}",
                procs.logs().display()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until Operation `name` is in `phase`; fails when a process exits, when it finishes
/// in another phase, or at [`DEADLINE`]. (Blocked is not final: right after a retry the
/// Operation still shows the Blocked it had.)
async fn wait_phase(
    procs: &mut Processes,
    ops: &Api<Operation>,
    name: &str,
    phase: OperationPhase,
    dir: &Path,
) -> Result<()> {
    let started = Instant::now();
    loop {
        procs.check_alive()?;
        let op = ops.get(name).await?;
        let now = op.status.as_ref().map(|s| s.phase).unwrap_or_default();
        if now == phase {
            return Ok(());
        }
        let settled = matches!(now, OperationPhase::Succeeded | OperationPhase::Failed);
        if settled || started.elapsed() >= DEADLINE {
            bail!(
                "Operation {name} is {now:?}, waiting for {phase:?}: {}; logs in {}",
                op.status.and_then(|s| s.message).unwrap_or_default(),
                dir.display()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The value of the sample line starting with `series ` in an exposition.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

const FAMILIES: [(&str, &str); 8] = [
    ("bosun_operations", "gauge"),
    ("bosun_steps", "counter"),
    ("bosun_step_duration_seconds", "histogram"),
    ("bosun_gate_duration_seconds", "histogram"),
    ("bosun_plugin_cache", "counter"),
    ("bosun_watch_lists", "counter"),
    ("bosun_leader", "gauge"),
    ("bosun_leader_lost", "counter"),
];

#[tokio::test]
async fn deploy_identities_run_an_operation_and_admin_servers_count_it() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    // The Operation below cordons and uncordons a lab node.
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    apply_crds(&lab.client).await?;
    publish_hello(&lab).await?;
    let node = lab.nodes.last().context("the lab has nodes")?.clone();

    // The controller and the agent run as deploy/'s ServiceAccounts, with deploy/'s RBAC
    // and admission policy in force: the Operation below succeeding is also the proof that
    // those grants are enough for a real run (cordon, plugin step, uncordon).
    ensure_namespace(&lab.client).await?;
    for file in [
        "deploy/controller/rbac.yaml",
        "deploy/agent/rbac.yaml",
        "deploy/admission/agent-own-node.yaml",
    ] {
        apply_file(&lab, file)?;
    }
    let instance = unique("install-metrics");
    let dir = target_dir().join("e2e-install").join(&instance);
    let mut procs = Processes::new(&dir)?;
    let (controller_port, agent_port) = (free_port()?, free_port()?);
    let (_, trust_root) = bosun_e2e::cluster::signing_key()?;
    let (controller_kubeconfig, agent_kubeconfig) = (
        dir.join("controller.kubeconfig"),
        dir.join("agent.kubeconfig"),
    );
    token_kubeconfig(
        &lab,
        &token_of(&lab.client, "bosun-controller", None).await?,
        &controller_kubeconfig,
    )?;
    let pod = agent_pod(&lab.client, &format!("agent-{instance}"), &node.name).await?;
    token_kubeconfig(
        &lab,
        &agent_token(&lab.client, Some(&pod)).await?,
        &agent_kubeconfig,
    )?;
    procs.spawn(
        "controller",
        Command::new(binary("bosun-controller")?)
            .env("KUBECONFIG", &controller_kubeconfig)
            .env("BOSUN_LOG", "info,kube=warn")
            .args(["--instance", &instance, "--resync-seconds", "2"])
            .args(["--admin-addr", &format!("127.0.0.1:{controller_port}")]),
    )?;
    procs.spawn(
        "agent",
        Command::new(binary("bosun-agent")?)
            .env("KUBECONFIG", &agent_kubeconfig)
            .env("BOSUN_LOG", "info,kube=warn")
            .args(["--instance", &instance, "--node-name", &node.name])
            .arg("--host-root")
            .arg(&node.host_root)
            .arg("--trust-root")
            .arg(&trust_root)
            .arg("--plugin-dir")
            .arg(dir.join("plugins"))
            .args(["--admin-addr", &format!("127.0.0.1:{agent_port}")]),
    )?;
    wait_ready(&mut procs, controller_port, "the controller").await?;
    wait_ready(&mut procs, agent_port, "the agent").await?;
    for (who, port) in [("controller", controller_port), ("agent", agent_port)] {
        ensure!(get(port, "/live")?.0 == 200, "the {who}'s /live is not 200");
        let (code, text) = get(port, "/metrics")?;
        ensure!(code == 200, "the {who}'s /metrics answered {code}");
        for (family, kind) in FAMILIES {
            ensure!(
                text.contains(&format!("# TYPE {family} {kind}\n")),
                "the {who}'s /metrics lacks {family} ({kind}):\n{text}"
            );
        }
    }

    // One node: cordon (controller), greet (agent, the signed hello plugin) from a file that
    // is not there yet, uncordon. The greet's preflight fails and the Operation blocks; the
    // file is written, a person sets `recovery: Retry`, and the Operation finishes. (The
    // retry path needs the controller's `patch` on NodeTasks: it clears the field.)
    let name = unique("install-metrics");
    let file = format!("/etc/{name}-release");
    let ops: Api<Operation> = Api::all(lab.client.clone());
    ops.patch(&name, &PatchParams::apply(MANAGER), &Patch::Apply(json!({
        "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation",
        "metadata": { "name": name, "labels": { "bosun.dev/instance": instance } },
        "spec": { "custom": { "groups": [{ "name": "one",
            "nodeSelector": { "matchLabels": { "kubernetes.io/hostname": node.name } },
            "steps": [
                { "name": "cordon", "runsOn": "controller", "action": "cordon" },
                { "name": "greet", "plugin": "hello", "action": "greet", "params": { "file": file } },
                { "name": "uncordon", "runsOn": "controller", "action": "uncordon" } ] }] } },
    })))
    .await
    .with_context(|| format!("creating Operation {name}"))?;
    wait_phase(&mut procs, &ops, &name, OperationPhase::Blocked, &dir).await?;
    std::fs::write(
        node.host_root.join(file.trim_start_matches('/')),
        "PRETTY_NAME=\"install test\"\n",
    )?;
    let tasks: Api<NodeTask> = Api::all(lab.client.clone());
    tasks
        .patch(
            &format!("{name}-{}", node.name),
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "recovery": "Retry" } })),
        )
        .await
        .context("setting recovery: Retry")?;
    wait_phase(&mut procs, &ops, &name, OperationPhase::Succeeded, &dir).await?;

    // These processes saw this one Operation only, so the counts are exact.
    let (_, controller) = get(controller_port, "/metrics")?;
    let (_, agent) = get(agent_port, "/metrics")?;
    // Each watch listed once, when it started: none listed again (issue #16).
    for (who, text, resources) in [
        (
            "controller",
            &controller,
            &["operations", "nodetasks", "nodes", "policies"][..],
        ),
        ("agent", &agent, &["nodetasks", "policies"][..]),
    ] {
        for resource in resources {
            let series = format!("bosun_watch_lists_total{{resource=\"{resource}\"}}");
            let got = sample(text, &series);
            ensure!(
                got == Some(1.0),
                "the {who}'s {series} is {got:?}, not 1:\n{text}"
            );
        }
    }
    for (text, series, want) in [
        (&controller, "bosun_operations{phase=\"Succeeded\"}", 1.0),
        (&controller, "bosun_operations{phase=\"Blocked\"}", 0.0),
        // It leads (it holds its Lease), never lost it; an agent never leads.
        (&controller, "bosun_leader", 1.0),
        (&controller, "bosun_leader_lost_total", 0.0),
        (&agent, "bosun_leader", 0.0),
        (
            &controller,
            "bosun_steps_total{side=\"controller\",outcome=\"succeeded\"}",
            2.0,
        ),
        (
            &controller,
            "bosun_step_duration_seconds_count{side=\"controller\",outcome=\"succeeded\"}",
            2.0,
        ),
        // The node's health gates were judged once, after its last step.
        (
            &controller,
            "bosun_gate_duration_seconds_count{gate=\"health\"}",
            1.0,
        ),
        // The greet ran twice: refused by its preflight, then (after the retry) succeeded.
        (
            &agent,
            "bosun_steps_total{side=\"agent\",outcome=\"preflight_failed\"}",
            1.0,
        ),
        (
            &agent,
            "bosun_steps_total{side=\"agent\",outcome=\"succeeded\"}",
            1.0,
        ),
        (
            &agent,
            "bosun_step_duration_seconds_count{side=\"agent\",outcome=\"succeeded\"}",
            1.0,
        ),
        (
            &agent,
            "bosun_gate_duration_seconds_count{gate=\"preflight\"}",
            2.0,
        ),
        // A fresh plugin store: fetched from the ConfigMap once, then found in the store.
        (&agent, "bosun_plugin_cache_total{result=\"miss\"}", 1.0),
        (&agent, "bosun_plugin_cache_total{result=\"hit\"}", 1.0),
    ] {
        let got = sample(text, series);
        ensure!(
            got == Some(want),
            "{series} is {got:?}, expected {want}:\n{text}"
        );
    }
    save_sample(&dir, &controller, &agent)?;
    // Metrics carry no names (docs/observability.md): not the Operation's, the node's, the
    // plugin's or the instance's, though all of them were in play.
    for (who, text) in [("controller", &controller), ("agent", &agent)] {
        for name in [
            name.as_str(),
            node.name.as_str(),
            "hello",
            instance.as_str(),
        ] {
            ensure!(
                !text.contains(name),
                "the {who}'s /metrics names {name:?}; metrics must carry no names:\n{text}"
            );
        }
    }
    // HEAD is answered as GET is, without a body (probes and load balancers use it).
    for (who, port) in [("controller", controller_port), ("agent", agent_port)] {
        for path in ["/live", "/ready", "/metrics"] {
            let (code, body) = request(port, "HEAD", path)?;
            ensure!(
                code == 200 && body.is_empty(),
                "HEAD {path} on the {who}'s admin server answered {code} with {} body bytes, \
                 expected 200 and no body",
                body.len()
            );
        }
    }
    // Nothing the run needed was refused: no 403 in either process's log.
    for who in ["controller", "agent"] {
        let log = std::fs::read_to_string(procs.log_of(who))?;
        ensure!(
            !log.contains("forbidden") && !log.contains("Forbidden"),
            "the {who} was refused an API call with deploy/'s RBAC:\n{log}"
        );
    }
    drop(procs);
    let pods: Api<Pod> = Api::namespaced(lab.client.clone(), NAMESPACE);
    pods.delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
        .await
        .context("deleting the agent Pod")?;
    // Passed: the Operation goes too (its NodeTask with it); the lab outlives test runs.
    ops.delete(&name, &DeleteParams::background())
        .await
        .with_context(|| format!("deleting Operation {name}"))?;
    Ok(())
}

/// Keeps the scrapes next to the processes' logs (docs/observability.md quotes one).
fn save_sample(dir: &Path, controller: &str, agent: &str) -> Result<()> {
    std::fs::write(dir.join("controller.metrics"), controller)?;
    std::fs::write(dir.join("agent.metrics"), agent)?;
    Ok(())
}

/// One version everywhere (issue 34): every crate takes the workspace's version
/// (`version.workspace = true`), so the controller, the agent and `kubectl-bosun` print it
/// (with the git commit, runtime/build/version.rs), deploy/kustomization.yaml installs the
/// images of that version, the Helm chart's version and appVersion are it, and so are the krew
/// manifest's version and archive. A release bumps `[workspace.package] version`, the image
/// tags, the chart and the krew manifest together, or this fails.
#[test]
fn one_version_everywhere() -> Result<()> {
    let root = bosun_e2e::workspace_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml"))?;
    let version = manifest
        .split("[workspace.package]")
        .nth(1)
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("version = ")))
        .map(|v| v.trim_matches('"').to_owned())
        .context("Cargo.toml has a [workspace.package] version")?;
    ensure!(
        version == env!("CARGO_PKG_VERSION"),
        "this crate takes the workspace's version"
    );

    let mut crates = Vec::new();
    for dir in ["runtime", "sdk", "plugins", "tests"] {
        for entry in walk_manifests(&root.join(dir))? {
            let text = std::fs::read_to_string(&entry)?;
            if text.contains("[package]") {
                ensure!(
                    text.contains("version.workspace = true"),
                    "{} sets a version of its own; use `version.workspace = true`",
                    entry.display()
                );
                crates.push(entry);
            }
        }
    }
    ensure!(
        crates.len() > 10,
        "found the workspace's crates: {crates:?}"
    );

    let kustomization: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(
        root.join("deploy/kustomization.yaml"),
    )?)?;
    let images = kustomization["images"]
        .as_sequence()
        .context("deploy/kustomization.yaml lists images")?;
    let chart: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(
        root.join("deploy/helm/bosun/Chart.yaml"),
    )?)?;
    for field in ["version", "appVersion"] {
        ensure!(
            chart[field].as_str() == Some(version.as_str()),
            "deploy/helm/bosun/Chart.yaml has {field} {:?}, the workspace is version {version}; set it to {version}",
            chart[field]
        );
    }
    for name in ["bosun-controller", "bosun-agent"] {
        let image = images
            .iter()
            .find(|i| i["name"].as_str() == Some(name))
            .with_context(|| format!("deploy/kustomization.yaml names the image {name}"))?;
        ensure!(
            image["newTag"].as_str() == Some(version.as_str()),
            "deploy/kustomization.yaml installs {name}:{:?}, the workspace is version {version}; set the tag to {version}",
            image["newTag"]
        );
    }
    // The krew manifest: its version, and the release archive its one platform names.
    let krew: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(
        root.join("deploy/krew/bosun.yaml"),
    )?)?;
    ensure!(
        krew["spec"]["version"].as_str() == Some(format!("v{version}").as_str()),
        "deploy/krew/bosun.yaml has spec.version {:?}, the workspace is version {version}; set it to v{version}",
        krew["spec"]["version"]
    );
    let uris: Vec<&str> = krew["spec"]["platforms"]
        .as_sequence()
        .context("deploy/krew/bosun.yaml lists platforms")?
        .iter()
        .filter_map(|p| p["uri"].as_str())
        .collect();
    ensure!(
        !uris.is_empty()
            && uris.iter().all(|u| u.ends_with(&format!(
                "/v{version}/kubectl-bosun_v{version}_linux_amd64.tar.gz"
            ))),
        "deploy/krew/bosun.yaml's archives {uris:?} are not those of v{version} (deploy/krew/build.sh names them kubectl-bosun_v{version}_linux_amd64.tar.gz)"
    );
    Ok(())
}

/// Every Cargo.toml below `dir` (not in build output).
fn walk_manifests(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_dir() && name != "target" && !name.starts_with('.') {
            found.extend(walk_manifests(&path)?);
        } else if name == "Cargo.toml" {
            found.push(path);
        }
    }
    Ok(found)
}

/// helm, built from the Go module proxy at its pinned version (tests/lab/build-helm.sh).
fn helm_binary() -> Result<std::path::PathBuf> {
    Ok(bosun_e2e::paths::go_tool_dir("build-helm.sh")?.join("helm"))
}

/// `helm ARGS`, its stdout, or an error with its stderr.
fn helm(helm: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(helm)
        .args(args)
        .current_dir(bosun_e2e::workspace_root())
        .output()
        .with_context(|| format!("running helm {}", args.join(" ")))?;
    ensure!(
        out.status.success(),
        "helm {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// Rendered YAML as its objects by (kind, namespace, name), numbers compared by value (one
/// renderer writes `0.0` where the other writes `0`).
fn objects_of(yaml: &str) -> Result<BTreeMap<(String, String, String), serde_json::Value>> {
    fn normalized(v: serde_json::Value) -> serde_json::Value {
        use serde_json::Value as V;
        match v {
            V::Number(n) => match n.as_f64() {
                Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => json!(f as i64),
                _ => V::Number(n),
            },
            V::Array(a) => V::Array(a.into_iter().map(normalized).collect()),
            V::Object(o) => V::Object(o.into_iter().map(|(k, v)| (k, normalized(v))).collect()),
            v => v,
        }
    }
    let mut found = BTreeMap::new();
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_yaml::Value::deserialize(doc)?;
        if value.is_null() {
            continue;
        }
        let value = normalized(serde_json::to_value(value)?);
        let field = |p: &str| {
            value
                .pointer(p)
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_owned()
        };
        let key = (
            field("/kind"),
            field("/metadata/namespace"),
            field("/metadata/name"),
        );
        ensure!(!key.0.is_empty(), "an object without a kind: {value}");
        ensure!(found.insert(key.clone(), value).is_none(), "{key:?} twice");
    }
    Ok(found)
}

/// The Helm chart (deploy/helm/bosun) installs what `kubectl apply -k deploy/` installs: with
/// its default values it renders the same objects, field by field, but for the differences
/// named here. `helm lint --strict` is clean, each value reaches its field, and a namespace
/// other than bosun-system is refused with the reason (issue 34).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_helm_chart_renders_what_kustomize_renders() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let bin = helm_binary()?;
    let chart = "deploy/helm/bosun";
    helm(&bin, &["lint", "--strict", "--namespace", NAMESPACE, chart])?;

    let rendered = objects_of(&helm(
        &bin,
        &[
            "template",
            "bosun",
            chart,
            "--namespace",
            NAMESPACE,
            "--include-crds",
        ],
    )?)?;
    let out = kubectl(&lab, &["kustomize", "deploy/"])?;
    ensure!(
        out.status.success(),
        "kubectl kustomize deploy/: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut kustomized = objects_of(&String::from_utf8(out.stdout)?)?;
    // The differences there must be:
    // 1. Helm installs into the release's namespace and creates no Namespace object;
    //    deploy/ creates bosun-system with its Pod Security labels (under Helm,
    //    docs/install.md applies deploy/namespace.yaml first).
    ensure!(
        kustomized
            .remove(&("Namespace".into(), String::new(), NAMESPACE.into()))
            .is_some(),
        "deploy/ creates the namespace"
    );
    // 2. Helm applies crds/ as they are (it never templates CRDs), so they lack the label
    //    deploy/kustomization.yaml adds to every object.
    for ((kind, _, _), object) in kustomized.iter_mut() {
        if kind == "CustomResourceDefinition" {
            let labels = object
                .pointer_mut("/metadata")
                .and_then(|m| m.as_object_mut())
                .context("a CRD has metadata")?;
            labels.remove("labels");
        }
    }
    let only_helm: Vec<_> = rendered
        .keys()
        .filter(|k| !kustomized.contains_key(*k))
        .collect();
    let only_kustomize: Vec<_> = kustomized
        .keys()
        .filter(|k| !rendered.contains_key(*k))
        .collect();
    ensure!(
        only_helm.is_empty() && only_kustomize.is_empty(),
        "the chart and deploy/ create different objects: only the chart {only_helm:?}, only deploy/ {only_kustomize:?}"
    );
    for (key, object) in &rendered {
        ensure!(
            Some(object) == kustomized.get(key),
            "{key:?} differs between the chart and deploy/:\nchart:   {object}\ndeploy/: {}",
            kustomized[key]
        );
    }
    ensure!(rendered.len() >= 25, "compared {} objects", rendered.len());

    // Values reach their fields.
    let set = objects_of(&helm(
        &bin,
        &[
            "template",
            "bosun",
            chart,
            "--namespace",
            NAMESPACE,
            "--set",
            "controller.replicas=3",
            "--set",
            "image.agent.repository=registry.example.com/bosun-agent,image.agent.tag=9.9.9",
            "--set",
            "image.pullPolicy=Always",
            "--set",
            "instance=blue",
            "--set",
            "agent.nodeSelector.pool=maintained",
            "--set",
            "agent.tolerations[0].key=dedicated,agent.tolerations[0].operator=Exists",
            "--set",
            "agent.resources.limits.memory=1Gi",
            "--set-string",
            "trustRoots.team\\.pub=PEM",
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "controller.prometheusPlainHttp={prometheus-operated.monitoring.svc:9090}",
        ],
    )?)?;
    let get = |kind: &str, name: &str, pointer: &str| -> Result<serde_json::Value> {
        set.get(&(kind.into(), NAMESPACE.into(), name.into()))
            .and_then(|o| o.pointer(pointer))
            .cloned()
            .with_context(|| format!("{kind} {name} has no {pointer}"))
    };
    let agent = "/spec/template/spec/containers/0";
    let cases = [
        (
            ("Deployment", "bosun-controller", "/spec/replicas"),
            json!(3),
        ),
        (
            ("DaemonSet", "bosun-agent", &*format!("{agent}/image")),
            json!("registry.example.com/bosun-agent:9.9.9"),
        ),
        (
            (
                "DaemonSet",
                "bosun-agent",
                &*format!("{agent}/imagePullPolicy"),
            ),
            json!("Always"),
        ),
        (
            ("DaemonSet", "bosun-agent", &*format!("{agent}/resources")),
            json!({ "limits": { "memory": "1Gi" } }),
        ),
        (
            (
                "DaemonSet",
                "bosun-agent",
                "/spec/template/spec/nodeSelector",
            ),
            json!({ "pool": "maintained" }),
        ),
        (
            (
                "DaemonSet",
                "bosun-agent",
                "/spec/template/spec/tolerations/2",
            ),
            json!({ "key": "dedicated", "operator": "Exists" }),
        ),
        (
            (
                "Deployment",
                "bosun-controller",
                "/spec/template/spec/containers/0/image",
            ),
            json!("ghcr.io/bosun-dev/bosun-controller:0.1.0"),
        ),
        (
            ("ConfigMap", "bosun-trust-roots", "/data"),
            json!({ "team.pub": "PEM" }),
        ),
        (
            ("ServiceMonitor", "bosun-agent", "/spec/endpoints/0/port"),
            json!("admin"),
        ),
    ];
    for ((kind, name, pointer), want) in cases {
        let got = get(kind, name, pointer)?;
        ensure!(
            got == want,
            "{kind} {name} {pointer}: {got}, expected {want}"
        );
    }
    for (kind, name) in [
        ("Deployment", "bosun-controller"),
        ("DaemonSet", "bosun-agent"),
    ] {
        let args = get(kind, name, "/spec/template/spec/containers/0/args")?;
        ensure!(
            args.as_array()
                .is_some_and(|a| a.contains(&json!("--instance=blue"))),
            "{kind} {name} runs with --instance=blue: {args}"
        );
    }
    let args = get(
        "Deployment",
        "bosun-controller",
        "/spec/template/spec/containers/0/args",
    )?;
    ensure!(
        args.as_array().is_some_and(|a| a.contains(&json!(
            "--prometheus-plain-http=prometheus-operated.monitoring.svc:9090"
        ))),
        "the controller may ask that Prometheus over plain http: {args}"
    );

    // Anywhere but bosun-system is refused, saying why.
    let wrong = Command::new(&bin)
        .args(["template", "bosun", chart, "--namespace", "default"])
        .current_dir(bosun_e2e::workspace_root())
        .output()?;
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    ensure!(
        !wrong.status.success()
            && stderr.contains("Bosun installs into the namespace bosun-system, not \"default\"")
            && stderr.contains("agent-own-node.yaml"),
        "the chart refuses another namespace with the reason: {stderr}"
    );
    Ok(())
}
