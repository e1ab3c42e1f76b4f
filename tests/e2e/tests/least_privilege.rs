//! Least privilege of the deployed identities, against the lab's real API server (RBAC
//! authorizer): a client holding a token of `deploy/`'s ServiceAccount, with `deploy/`'s
//! RBAC applied, tries what the identity must never do and each call is refused with 403
//! Forbidden naming the verb and resource; the calls it needs are made too, and succeed, so
//! the refusals are not a token that works for nothing.
//!
//! - The controller (deploy/controller/rbac.yaml): no Secrets at all, no ConfigMaps (read or
//!   write), no pod deletes, creates or patches (drain lists pods and evicts them, and that
//!   eviction is allowed and really removes a pod), no Node creates or deletes, no Plugin
//!   access, no changes to Operations' specs, no NodeTask deletes, no Leases outside
//!   bosun-system, no Namespace but kube-system.
//! - The agent (deploy/agent/rbac.yaml, a token bound to a Pod on a node, as the DaemonSet's
//!   is): no writes to Plugins, Policies (or their status) or Nodes (spec or status), no
//!   Secrets, no ConfigMaps outside bosun-system and no ConfigMap writes in it, no evictions
//!   or pod deletes.
//!
//! Drain and the TTL delete running under the controller's identity are in
//! controller_actions.rs (all its controllers run as the deployed ServiceAccount); a full
//! Operation under both identities is in install.rs.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bosun_api::node_task::NodeTask;
use bosun_api::operation::Operation;
use bosun_api::plugin::Plugin;
use bosun_api::policy::Policy;
use bosun_e2e::identity::{
    AGENT_SA, CONTROLLER_SA, NAMESPACE, agent_pod, apply_deploy_file, client_with_token, forbidden,
    token_of,
};
use bosun_e2e::{DEADLINE, MANAGER, unique};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret};
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// The outcome of one call made with a deployed identity.
type Outcome<T> = std::result::Result<T, kube::Error>;

/// Checks that `result` is a 403 whose message says `user` cannot `verb` `resource`, as the
/// RBAC authorizer words it (`cannot <verb> resource "<resource>"`).
fn refused<T: std::fmt::Debug>(
    result: Outcome<T>,
    user: &str,
    verb: &str,
    resource: &str,
) -> Result<()> {
    let Some(message) = forbidden(&result) else {
        bail!("{user} was allowed to {verb} {resource} (expected 403 Forbidden): {result:?}");
    };
    let expected = format!("cannot {verb} resource \"{resource}\"");
    ensure!(
        message.contains(&expected) && message.contains(user),
        "{user} {verb} {resource}: refused, but not by RBAC as expected ({expected:?}): {message}"
    );
    Ok(())
}

/// Waits until `token`'s client may list Nodes: RBAC bindings just applied reach the
/// authorizer's cache a moment later, and a refusal before that would prove nothing.
async fn wait_authorized(client: &Client, who: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let started = Instant::now();
    loop {
        match nodes.list(&ListParams::default().limit(1)).await {
            Ok(_) => return Ok(()),
            Err(e) if started.elapsed() >= DEADLINE => {
                bail!("{who} still cannot list Nodes, which its role grants: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// A namespace of this test with one ConfigMap, one Secret and one Pod bound to `node`
/// (never started: the lab runs no kubelet), made with the admin client.
async fn fixtures(admin: &Client, ns: &str, node: &str) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let body = json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": ns } });
    namespaces
        .patch(ns, &PatchParams::apply(MANAGER), &Patch::Apply(body))
        .await
        .with_context(|| format!("creating namespace {ns}"))?;
    let maps: Api<ConfigMap> = Api::namespaced(admin.clone(), ns);
    let cm = json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "c" },
                     "data": { "k": "v" } });
    maps.patch("c", &PatchParams::apply(MANAGER), &Patch::Apply(cm))
        .await?;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), ns);
    let secret = json!({ "apiVersion": "v1", "kind": "Secret", "metadata": { "name": "s" },
                         "stringData": { "k": "v" } });
    secrets
        .patch("s", &PatchParams::apply(MANAGER), &Patch::Apply(secret))
        .await?;
    for name in ["p", "q"] {
        let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": { "name": name },
            "spec": { "nodeName": node, "terminationGracePeriodSeconds": 0,
                      "containers": [{ "name": "c", "image": "registry.invalid/none" }] },
        }))?;
        pods.create(&PostParams::default(), &pod)
            .await
            .with_context(|| format!("creating pod {ns}/{name}"))?;
    }
    Ok(())
}

fn cm_body(name: &str) -> ConfigMap {
    serde_json::from_value(json!({ "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": { "name": name }, "data": { "k": "v" } }))
    .expect("a valid ConfigMap")
}

fn secret_body(name: &str) -> Secret {
    serde_json::from_value(json!({ "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": name }, "stringData": { "k": "v" } }))
    .expect("a valid Secret")
}

/// Refusals every deployed identity shares: Secrets in any form, ConfigMap writes in `ns`.
async fn no_secrets_no_configmap_writes(client: &Client, user: &str, ns: &str) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    refused(secrets.get("s").await, user, "get", "secrets")?;
    refused(
        secrets.list(&ListParams::default()).await,
        user,
        "list",
        "secrets",
    )?;
    refused(
        Api::<Secret>::all(client.clone())
            .list(&ListParams::default())
            .await,
        user,
        "list",
        "secrets",
    )?;
    refused(
        secrets
            .create(&PostParams::default(), &secret_body("new"))
            .await,
        user,
        "create",
        "secrets",
    )?;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    refused(
        maps.create(&PostParams::default(), &cm_body("new")).await,
        user,
        "create",
        "configmaps",
    )?;
    let change = Patch::Merge(json!({ "data": { "k": "changed" } }));
    refused(
        maps.patch("c", &PatchParams::default(), &change).await,
        user,
        "patch",
        "configmaps",
    )?;
    refused(
        maps.replace("c", &PostParams::default(), &cm_body("c"))
            .await,
        user,
        "update",
        "configmaps",
    )?;
    refused(
        maps.delete("c", &DeleteParams::default()).await,
        user,
        "delete",
        "configmaps",
    )?;
    Ok(())
}

/// The controller's ServiceAccount may list pods and evict them (drain), and nothing more
/// on pods; it is refused Secrets, ConfigMaps, Node creates and deletes, Plugins, changes to
/// Operations' specs, creating any Operation but a generated upgrade, renewal or one-node
/// reboot, NodeTask
/// deletes, Leases outside bosun-system and other Namespaces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controllers_identity_is_refused_what_drain_and_reconcile_do_not_need() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    bosun_e2e::apply_crds(&lab.client).await?;
    apply_deploy_file(&lab, "deploy/controller/rbac.yaml").await?;
    apply_deploy_file(
        &lab,
        "deploy/admission/controller-generated-operations.yaml",
    )
    .await?;
    let user = format!("system:serviceaccount:{NAMESPACE}:{CONTROLLER_SA}");
    let controller =
        client_with_token(&lab, &token_of(&lab.client, CONTROLLER_SA, None).await?).await?;
    wait_authorized(&controller, &user).await?;
    let node = lab.nodes.last().context("the lab has nodes")?.name.clone();
    let ns = unique("least-priv-ctl");
    fixtures(&lab.client, &ns, &node).await?;

    no_secrets_no_configmap_writes(&controller, &user, &ns).await?;
    // The controller never reads ConfigMaps either (plugins are the agent's business).
    let maps: Api<ConfigMap> = Api::namespaced(controller.clone(), &ns);
    refused(maps.get("c").await, &user, "get", "configmaps")?;
    refused(
        maps.list(&ListParams::default()).await,
        &user,
        "list",
        "configmaps",
    )?;

    // Pods: drain lists and evicts; deleting, creating or changing one is refused.
    let pods: Api<Pod> = Api::namespaced(controller.clone(), &ns);
    refused(
        pods.delete("p", &DeleteParams::default()).await,
        &user,
        "delete",
        "pods",
    )?;
    refused(
        pods.delete_collection(&DeleteParams::default(), &ListParams::default())
            .await,
        &user,
        "deletecollection",
        "pods",
    )?;
    refused(pods.get("p").await, &user, "get", "pods")?;
    let label = Patch::Merge(json!({ "metadata": { "labels": { "x": "y" } } }));
    refused(
        pods.patch("p", &PatchParams::default(), &label).await,
        &user,
        "patch",
        "pods",
    )?;
    let copy: Pod = serde_json::from_value(json!({ "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "r" }, "spec": { "containers": [{ "name": "c", "image": "x" }] } }))?;
    refused(
        pods.create(&PostParams::default(), &copy).await,
        &user,
        "create",
        "pods",
    )?;
    let listed = pods
        .list(&ListParams::default())
        .await
        .context("the controller listing pods (drain)")?;
    ensure!(
        listed.items.len() == 2,
        "the controller lists the namespace's two pods: {listed:?}"
    );
    let admin_pods: Api<Pod> = Api::namespaced(lab.client.clone(), &ns);
    pods.evict("p", &EvictParams::default())
        .await
        .context("the controller evicting a pod (drain)")?;
    let started = Instant::now();
    while admin_pods.get_opt("p").await?.is_some() {
        ensure!(
            started.elapsed() < DEADLINE,
            "the pod the controller evicted is still there"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    ensure!(
        admin_pods.get_opt("q").await?.is_some(),
        "the other pod is left"
    );

    // Nodes: read and patched (cordon), never created or deleted.
    let nodes: Api<Node> = Api::all(controller.clone());
    refused(
        nodes.delete(&node, &DeleteParams::default()).await,
        &user,
        "delete",
        "nodes",
    )?;
    let made: Node = serde_json::from_value(json!({ "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": unique("least-priv-node") } }))?;
    refused(
        nodes.create(&PostParams::default(), &made).await,
        &user,
        "create",
        "nodes",
    )?;
    refused(
        nodes
            .patch_status(
                &node,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": {} })),
            )
            .await,
        &user,
        "patch",
        "nodes/status",
    )?;

    // Bosun's own objects: no Plugins, no Operation spec changes, no NodeTask deletes, no
    // Policy writes.
    let plugins: Api<Plugin> = Api::all(controller.clone());
    refused(plugins.get("hello").await, &user, "get", "plugins")?;
    refused(
        plugins.delete("hello", &DeleteParams::default()).await,
        &user,
        "delete",
        "plugins",
    )?;
    let ops: Api<Operation> = Api::all(controller.clone());
    let op = unique("least-priv");
    let spec = Patch::Merge(json!({ "spec": { "paused": true } }));
    refused(
        ops.patch(&op, &PatchParams::default(), &spec).await,
        &user,
        "patch",
        "operations",
    )?;
    let body: Operation = serde_json::from_value(json!({
        "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation", "metadata": { "name": op },
        "spec": { "custom": { "groups": [{ "name": "g",
            "steps": [{ "name": "s", "runsOn": "controller", "action": "cordon" }] }] } },
    }))?;
    // RBAC lets the controller create Operations (the ClusterLifecycle's generated ones);
    // the admission policy refuses every other create, such as this custom Operation.
    let policy = "bosun-controller-generated-operations";
    let started = Instant::now();
    // The lab outlives test runs: until the API server has the policy as this tree has it,
    // it refuses with an older message (and an older rule), so wait for this one's.
    let current = "labelled bosun.dev/lifecycle=upgrade, renewCertificates or reboot";
    let refusal = loop {
        match ops.create(&PostParams::default(), &body).await {
            Err(kube::Error::Api(e))
                if e.code == 403
                    && e.message.contains(&format!("'{policy}'"))
                    && e.message.contains(current) =>
            {
                break e.message;
            }
            Err(kube::Error::Api(e))
                if e.code == 403 && e.message.contains(&format!("'{policy}'")) => {}
            Ok(made) => {
                // The policy is not in force yet (the API server's informer lags): remove
                // the object and try again.
                let admin_ops: Api<Operation> = Api::all(lab.client.clone());
                admin_ops
                    .delete(&made.name_any(), &DeleteParams::default())
                    .await?;
            }
            Err(e) => bail!("creating a custom Operation as the controller: {e}"),
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "{policy} never refused the controller creating a custom Operation with the rule of deploy/admission/controller-generated-operations.yaml as this tree has it"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    ensure!(
        refusal.contains(
            "bosun-controller may create only the Operations a ClusterLifecycle generates"
        ),
        "{refusal}"
    );
    // A generated renewal (named and labelled as the reconciler makes it) is allowed.
    let generated: Operation = serde_json::from_value(json!({
        "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation",
        "metadata": { "name": format!("lifecycle-{op}"),
                      "labels": { "bosun.dev/lifecycle": "renewCertificates", "bosun.dev/instance": op } },
        "spec": { "renewCertificates": {}, "paused": true },
    }))?;
    ops.create(&PostParams::default(), &generated)
        .await
        .context("the controller creating a generated renewal")?;
    Api::<Operation>::all(lab.client.clone())
        .delete(&format!("lifecycle-{op}"), &DeleteParams::default())
        .await?;
    // A renewal labelled as an upgrade is refused.
    let mut mislabelled = generated.clone();
    mislabelled.metadata.name = Some(format!("lifecycle-x-{op}"));
    mislabelled
        .metadata
        .labels
        .as_mut()
        .map(|l| l.insert("bosun.dev/lifecycle".into(), "upgrade".into()));
    match ops.create(&PostParams::default(), &mislabelled).await {
        Err(kube::Error::Api(e)) if e.code == 403 => {}
        other => bail!("a mislabelled generated Operation: {other:?}"),
    }
    // A generated reboot names one node; a reboot of every node is not one the reconciler
    // makes, and is refused.
    let reboot = |name: String, nodes: serde_json::Value| -> Result<Operation> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation",
            "metadata": { "name": name,
                          "labels": { "bosun.dev/lifecycle": "reboot", "bosun.dev/instance": op } },
            "spec": { "reboot": { "nodes": nodes }, "paused": true },
        }))?)
    };
    ops.create(
        &PostParams::default(),
        &reboot(format!("lifecycle-reboot-{op}"), json!(["lab-worker-1"]))?,
    )
    .await
    .context("the controller creating a generated reboot of one node")?;
    Api::<Operation>::all(lab.client.clone())
        .delete(&format!("lifecycle-reboot-{op}"), &DeleteParams::default())
        .await?;
    for nodes in [json!([]), json!(["lab-worker-1", "lab-worker-2"])] {
        match ops
            .create(
                &PostParams::default(),
                &reboot(format!("lifecycle-reboot-all-{op}"), nodes.clone())?,
            )
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 403 => {}
            other => bail!("a generated-looking reboot of nodes {nodes}: {other:?}"),
        }
    }
    let tasks: Api<NodeTask> = Api::all(controller.clone());
    refused(
        tasks.delete(&op, &DeleteParams::default()).await,
        &user,
        "delete",
        "nodetasks",
    )?;
    let policies: Api<Policy> = Api::all(controller.clone());
    refused(
        policies.delete(&op, &DeleteParams::default()).await,
        &user,
        "delete",
        "policies",
    )?;

    // Leader election only in bosun-system; Namespaces only kube-system, read only.
    let leases: Api<Lease> = Api::namespaced(controller.clone(), "kube-system");
    refused(
        leases.get("kube-controller-manager").await,
        &user,
        "get",
        "leases",
    )?;
    let namespaces: Api<Namespace> = Api::all(controller.clone());
    namespaces
        .get("kube-system")
        .await
        .context("the controller reading kube-system")?;
    refused(namespaces.get("default").await, &user, "get", "namespaces")?;
    refused(
        namespaces.delete(&ns, &DeleteParams::default()).await,
        &user,
        "delete",
        "namespaces",
    )?;

    Api::<Namespace>::all(lab.client.clone())
        .delete(&ns, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting namespace {ns}"))?;
    Ok(())
}

/// The agent's ServiceAccount, with a token bound to a Pod on a node as the DaemonSet's,
/// reads Plugins, Policies and Nodes and is refused writing any of them; it is refused
/// Secrets, ConfigMaps outside bosun-system and ConfigMap writes in it, and evicting or
/// deleting pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_identity_is_refused_writing_plugins_policies_and_nodes() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    bosun_e2e::apply_crds(&lab.client).await?;
    apply_deploy_file(&lab, "deploy/agent/rbac.yaml").await?;
    apply_deploy_file(&lab, "deploy/admission/agent-own-node.yaml").await?;
    let node = lab.nodes.last().context("the lab has nodes")?.name.clone();
    let run = unique("least-priv-agent");
    let pod = agent_pod(&lab.client, &format!("agent-{run}"), &node).await?;
    let user = format!("system:serviceaccount:{NAMESPACE}:{AGENT_SA}");
    let agent =
        client_with_token(&lab, &token_of(&lab.client, AGENT_SA, Some(&pod)).await?).await?;
    wait_authorized(&agent, &user).await?;
    let ns = unique("least-priv-agt");
    fixtures(&lab.client, &ns, &node).await?;
    // A Plugin and a Policy to try to change (their content does not matter here).
    let plugins: Api<Plugin> = Api::all(lab.client.clone());
    let plugin: Plugin = serde_json::from_value(json!({
        "apiVersion": "bosun.dev/v1alpha1", "kind": "Plugin", "metadata": { "name": run },
        "spec": { "source": { "url": { "url": "https://plugins.invalid/x.wasm" } },
                  "sha256": format!("sha256:{}", "0".repeat(64)), "signatures": [{ "algorithm": "ed25519", "signature": "AAAA" }], "grants": {} },
    }))?;
    plugins
        .create(&PostParams::default(), &plugin)
        .await
        .context("creating the probe Plugin")?;
    let policies: Api<Policy> = Api::all(lab.client.clone());
    let policy: Policy = serde_json::from_value(json!({
        "apiVersion": "bosun.dev/v1alpha1", "kind": "Policy", "metadata": { "name": run },
        "spec": { "rego": "package bosun.step.least_priv\n", "enforcement": "Audit" },
    }))?;
    policies
        .create(&PostParams::default(), &policy)
        .await
        .context("creating the probe Policy")?;

    // Plugins: read, never written.
    let as_agent: Api<Plugin> = Api::all(agent.clone());
    as_agent
        .get(&run)
        .await
        .context("the agent reading a Plugin")?;
    let grant_more = Patch::Merge(
        json!({ "spec": { "grants": { "filesystem": [{ "path": "/", "access": "ReadWrite" }] } } }),
    );
    refused(
        as_agent
            .patch(&run, &PatchParams::default(), &grant_more)
            .await,
        &user,
        "patch",
        "plugins",
    )?;
    refused(
        as_agent
            .replace(&run, &PostParams::default(), &as_agent.get(&run).await?)
            .await,
        &user,
        "update",
        "plugins",
    )?;
    let mut other = plugin.clone();
    other.metadata.name = Some(format!("{run}-new"));
    refused(
        as_agent.create(&PostParams::default(), &other).await,
        &user,
        "create",
        "plugins",
    )?;
    refused(
        as_agent.delete(&run, &DeleteParams::default()).await,
        &user,
        "delete",
        "plugins",
    )?;

    // Policies: read (the step gate), never written, nor their status.
    let as_agent: Api<Policy> = Api::all(agent.clone());
    as_agent
        .list(&ListParams::default())
        .await
        .context("the agent listing Policies")?;
    let disarm = Patch::Merge(json!({ "spec": { "enforcement": "Audit" } }));
    refused(
        as_agent.patch(&run, &PatchParams::default(), &disarm).await,
        &user,
        "patch",
        "policies",
    )?;
    let mut other = policy.clone();
    other.metadata.name = Some(format!("{run}-new"));
    refused(
        as_agent.create(&PostParams::default(), &other).await,
        &user,
        "create",
        "policies",
    )?;
    refused(
        as_agent.delete(&run, &DeleteParams::default()).await,
        &user,
        "delete",
        "policies",
    )?;
    let status = Patch::Merge(json!({ "status": { "compiled": false } }));
    refused(
        as_agent
            .patch_status(&run, &PatchParams::default(), &status)
            .await,
        &user,
        "patch",
        "policies/status",
    )?;

    // Nodes: read (policy facts), never written: no cordon, no labels, no status, no delete.
    let nodes: Api<Node> = Api::all(agent.clone());
    nodes
        .get(&node)
        .await
        .context("the agent reading its Node")?;
    let cordon = Patch::Merge(json!({ "spec": { "unschedulable": true } }));
    refused(
        nodes.patch(&node, &PatchParams::default(), &cordon).await,
        &user,
        "patch",
        "nodes",
    )?;
    let ready = Patch::Merge(json!({ "status": { "conditions": [] } }));
    refused(
        nodes
            .patch_status(&node, &PatchParams::default(), &ready)
            .await,
        &user,
        "patch",
        "nodes/status",
    )?;
    refused(
        nodes.delete(&node, &DeleteParams::default()).await,
        &user,
        "delete",
        "nodes",
    )?;
    let made: Node = serde_json::from_value(json!({ "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": format!("{run}-node") } }))?;
    refused(
        nodes.create(&PostParams::default(), &made).await,
        &user,
        "create",
        "nodes",
    )?;

    // Secrets, ConfigMaps: plugin bytes are read from bosun-system only, never written.
    no_secrets_no_configmap_writes(&agent, &user, &ns).await?;
    let maps: Api<ConfigMap> = Api::namespaced(agent.clone(), &ns);
    refused(maps.get("c").await, &user, "get", "configmaps")?;
    let own: Api<ConfigMap> = Api::namespaced(agent.clone(), NAMESPACE);
    refused(
        own.create(&PostParams::default(), &cm_body(&run)).await,
        &user,
        "create",
        "configmaps",
    )?;
    refused(
        own.list(&ListParams::default()).await,
        &user,
        "list",
        "configmaps",
    )?;

    // Pods: no evictions, no deletes (draining is the controller's).
    let pods: Api<Pod> = Api::namespaced(agent.clone(), &ns);
    refused(
        pods.evict("p", &EvictParams::default()).await,
        &user,
        "create",
        "pods/eviction",
    )?;
    refused(
        pods.delete("p", &DeleteParams::default()).await,
        &user,
        "delete",
        "pods",
    )?;

    plugins
        .delete(&run, &DeleteParams::default())
        .await
        .context("deleting the probe Plugin")?;
    policies
        .delete(&run, &DeleteParams::default())
        .await
        .context("deleting the probe Policy")?;
    Api::<Pod>::namespaced(lab.client.clone(), NAMESPACE)
        .delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
        .await
        .context("deleting the agent Pod")?;
    Api::<Namespace>::all(lab.client.clone())
        .delete(&ns, &DeleteParams::default())
        .await
        .with_context(|| format!("deleting namespace {ns}"))?;
    Ok(())
}
