//! The controller's own actions end to end, against the lab's real kube-apiserver and
//! kube-controller-manager: drain through the eviction API with a real PodDisruptionBudget
//! (its status computed by the disruption controller), health gates, leader election
//! through a Lease, Events, and `ttlSecondsAfterFinished` (NodeTasks removed by the real
//! garbage collector).
//!
//! Every Operation here has controller steps only, so no agent is needed: each test makes
//! its own Node objects (no kubelet: the test writes their status, as the lab does for its
//! own nodes) labelled with the test's instance, selects them with the Operation's
//! `nodeSelector`, and runs its own `bosun-controller` processes with `--instance`. Tests
//! therefore do not touch the lab's nodes or each other's objects, and run in parallel.
//! Pods are bound to a node with `spec.nodeName` and given `terminationGracePeriodSeconds:
//! 0`, so an eviction deletes them at once (no kubelet would ever confirm a graceful stop);
//! a pod a PodDisruptionBudget should protect is marked Running and Ready through the status
//! subresource, since the API server lets Pending pods be evicted regardless of budgets.
//!
//! The controllers run as `deploy/controller/rbac.yaml`'s ServiceAccount (a token of
//! `bosun-system/bosun-controller`, exactly its ClusterRole and leader-election Role), so
//! drain, health gates, leader election, Events and the TTL delete are shown to work with
//! the deployed rights; each test also fails if a controller logged a refused (403) call.
//!
//! Run `cargo build -p bosun-controller` before `cargo test -p bosun-e2e --test
//! controller_actions` (`cargo test --workspace` builds it first).

use std::collections::BTreeSet;
use std::future::Future;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bosun_api::node_task::{BlockReason, NodeTask, NodeTaskPhase, StepPhase};
use bosun_api::operation::{Operation, OperationPhase};
use bosun_e2e::operator::{delete_instance_operations, describe_tasks, phase_of, tasks_of};
use bosun_e2e::{DEADLINE, MANAGER, Processes, binary, events_about, target_dir, unique};
use bosun_lab::LabHandle;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// The label that scopes Operations (and the nodes of these tests) to one test.
const INSTANCE_LABEL: &str = "bosun.dev/instance";
/// Where the controllers' leader Lease lives (the controller's default).
const LEASE_NAMESPACE: &str = "bosun-system";
const POLL: Duration = Duration::from_millis(250);

/// One test's world: its instance name, its controllers, and the Nodes and namespace it
/// made (deleted by [`World::clean_up`], which every test calls whether it passed or not;
/// its Operations too when it passed).
struct World {
    client: Client,
    kubeconfig: PathBuf,
    instance: String,
    procs: Processes,
    nodes: Vec<String>,
    namespace: Option<String>,
}

impl World {
    async fn new(lab: &LabHandle, test: &str) -> Result<World> {
        bosun_e2e::apply_crds(&lab.client).await?;
        let instance = unique(test);
        let procs = Processes::new(&target_dir().join("e2e-controller-actions").join(&instance))?;
        let namespaces: Api<Namespace> = Api::all(lab.client.clone());
        let ns = json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": LEASE_NAMESPACE } });
        namespaces
            .patch(
                LEASE_NAMESPACE,
                &PatchParams::apply(MANAGER),
                &Patch::Apply(ns),
            )
            .await
            .context("creating the bosun-system namespace")?;
        // The controllers run as the deployed controller: deploy/controller/rbac.yaml's
        // ServiceAccount and rights, not the lab's admin (drain, leader election, Events and
        // the TTL delete are all refused otherwise; `with_world` checks no call was).
        let kubeconfig = procs.logs().join("controller.kubeconfig");
        bosun_e2e::identity::controller_kubeconfig(lab, &kubeconfig).await?;
        Ok(World {
            client: lab.client.clone(),
            kubeconfig,
            instance,
            procs,
            nodes: Vec::new(),
            namespace: None,
        })
    }

    /// Starts a controller of this instance named `name` (also its leader identity).
    fn start_controller(&mut self, name: &str) -> Result<()> {
        let mut cmd = Command::new(binary("bosun-controller")?);
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .env("BOSUN_LOG", "info,kube=warn")
            .args([
                "--instance",
                &self.instance,
                "--identity",
                name,
                "--resync-seconds",
                "2",
            ])
            // Short lease so a takeover happens within the test's patience.
            .args([
                "--lease-duration-seconds",
                "4",
                "--lease-renew-seconds",
                "1",
            ]);
        self.procs.spawn(name, &mut cmd)
    }

    /// A Node object labelled with this instance, Ready or not (status written as a kubelet
    /// would). Name sorts by `prefix`, so tests choose the plan order.
    async fn node(&mut self, prefix: &str, ready: bool) -> Result<String> {
        let name = unique(prefix);
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": name, "labels": { INSTANCE_LABEL: self.instance } } });
        nodes
            .patch(&name, &PatchParams::apply(MANAGER), &Patch::Apply(node))
            .await
            .with_context(|| format!("creating node {name}"))?;
        self.nodes.push(name.clone());
        // Admission gives a new Node the not-ready taint; a kubelet's node lifecycle
        // controller would lift it, and the lab runs none (as for the lab's own nodes).
        nodes
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "spec": { "taints": [] } })),
            )
            .await
            .with_context(|| format!("clearing the taints of node {name}"))?;
        set_node_ready(&self.client, &name, ready).await?;
        Ok(name)
    }

    async fn namespace(&mut self) -> Result<String> {
        let name = self.instance.clone();
        let api: Api<Namespace> = Api::all(self.client.clone());
        let ns = json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": name } });
        api.patch(&name, &PatchParams::apply(MANAGER), &Patch::Apply(ns))
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        self.namespace = Some(name.clone());
        Ok(name)
    }

    /// Creates an Operation of this instance over this instance's nodes: one custom group
    /// `nodes` with `steps`, plus `extra` spec fields.
    async fn operation(
        &self,
        prefix: &str,
        steps: serde_json::Value,
        extra: serde_json::Value,
    ) -> Result<String> {
        let name = unique(prefix);
        let mut spec = json!({
            "nodeSelector": { "matchLabels": { INSTANCE_LABEL: self.instance } },
            "custom": { "groups": [{ "name": "nodes", "steps": steps }] },
        });
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        let op = json!({
            "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation",
            "metadata": { "name": name, "labels": { INSTANCE_LABEL: self.instance } },
            "spec": spec,
        });
        let ops: Api<Operation> = Api::all(self.client.clone());
        ops.patch(&name, &PatchParams::apply(MANAGER), &Patch::Apply(op))
            .await
            .with_context(|| format!("creating Operation {name}"))?;
        Ok(name)
    }

    /// Polls `probe` until it yields a value; fails when a controller of this test exited,
    /// or at [`DEADLINE`] with `what`, the Operation `op`'s state and where the logs are.
    async fn wait<T, F, Fut>(&mut self, what: &str, op: &str, mut probe: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<T>>>,
    {
        let started = Instant::now();
        loop {
            self.procs.check_alive()?;
            if let Some(v) = probe().await? {
                return Ok(v);
            }
            if started.elapsed() >= DEADLINE {
                let ops: Api<Operation> = Api::all(self.client.clone());
                let current = ops.get_opt(op).await.ok().flatten().and_then(|o| o.status);
                bail!(
                    "not reached within {DEADLINE:?}: {what}\n  Operation {op}: {:?}\n{}  logs: {}",
                    current.map(|s| (s.phase, s.message)),
                    describe_tasks(&self.client, op).await,
                    self.procs.logs().display()
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn wait_phase(&mut self, op: &str, phase: OperationPhase) -> Result<Operation> {
        let client = self.client.clone();
        let name = op.to_string();
        self.wait(&format!("Operation {op} in phase {phase:?}"), op, || {
            let ops: Api<Operation> = Api::all(client.clone());
            let name = name.clone();
            async move { Ok(ops.get_opt(&name).await?.filter(|o| phase_of(o) == phase)) }
        })
        .await
    }

    async fn wait_task(
        &mut self,
        op: &str,
        node: &str,
        what: &str,
        done: impl Fn(&NodeTask) -> bool,
    ) -> Result<NodeTask> {
        let client = self.client.clone();
        let (opname, node) = (op.to_string(), node.to_string());
        let done = &done;
        self.wait(&format!("NodeTask of {op} on {node}: {what}"), op, || {
            let (client, opname, node) = (client.clone(), opname.clone(), node.clone());
            async move {
                Ok(tasks_of(&client, &opname)
                    .await?
                    .remove(&node)
                    .filter(|t| done(t)))
            }
        })
        .await
    }

    /// Deletes the Nodes and the namespace this test made, and, when the test `passed`,
    /// its Operations (their NodeTasks go with them). A failing test's Operations stay for
    /// inspection (`kubectl get operations -l bosun.dev/instance=<instance>`); no
    /// controller of this instance is left to act on them.
    async fn clean_up(self, passed: bool) {
        let World {
            client,
            procs,
            nodes,
            namespace,
            instance,
            ..
        } = self;
        // Controllers first, so none acts on a node while it goes.
        drop(procs);
        let api: Api<Node> = Api::all(client.clone());
        for n in &nodes {
            let _ = api.delete(n, &DeleteParams::default()).await;
        }
        if let Some(ns) = &namespace {
            let api: Api<Namespace> = Api::all(client.clone());
            let _ = api.delete(ns, &DeleteParams::default()).await;
        }
        if passed && let Err(e) = delete_instance_operations(&client, &instance).await {
            eprintln!("{e:#}");
        }
    }
}

async fn set_node_ready(client: &Client, node: &str, ready: bool) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let (status, reason, message) = if ready {
        ("True", "KubeletReady", "kubelet is posting ready status")
    } else {
        ("False", "KubeletNotReady", "container runtime is down")
    };
    let now = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let body = json!({ "status": { "conditions": [{ "type": "Ready", "status": status, "reason": reason, "message": message, "lastHeartbeatTime": now, "lastTransitionTime": now }] } });
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(body))
        .await
        .with_context(|| format!("setting node {node} Ready={status}"))?;
    Ok(())
}

/// A pod bound to `node` (no scheduler, no kubelet), deleted at once when evicted.
fn pod(name: &str, node: &str, labels: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "labels": labels },
        "spec": { "nodeName": node, "terminationGracePeriodSeconds": 0, "containers": [{ "name": "c", "image": "registry.invalid/none" }] },
    })
}

async fn create_pod(client: &Client, ns: &str, body: serde_json::Value) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(body)?;
    pods.create(&PostParams::default(), &pod)
        .await
        .with_context(|| format!("creating pod {ns}/{}", pod.name_any()))?;
    Ok(())
}

/// Marks a pod Running and Ready, as its kubelet would: a PodDisruptionBudget counts only
/// healthy pods, and the API server evicts Pending pods without asking budgets.
async fn mark_running(client: &Client, ns: &str, name: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let body = json!({ "status": { "phase": "Running", "conditions": [{ "type": "Ready", "status": "True" }] } });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(body))
        .await
        .with_context(|| format!("marking pod {ns}/{name} Running"))?;
    Ok(())
}

async fn pod_exists(client: &Client, ns: &str, name: &str) -> Result<bool> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    Ok(pods.get_opt(name).await?.is_some())
}

fn reasons(events: &[Event]) -> BTreeSet<String> {
    events.iter().filter_map(|e| e.reason.clone()).collect()
}

fn step<'a>(task: &'a NodeTask, name: &str) -> Option<&'a bosun_api::node_task::StepStatus> {
    task.status
        .as_ref()
        .and_then(|s| s.steps.iter().find(|x| x.name == name))
}

/// Runs `body` and then cleans the world up, whatever `body` returned.
async fn with_world<F, Fut>(test: &str, body: F) -> Result<()>
where
    F: FnOnce(World) -> Fut,
    Fut: Future<Output = (World, Result<()>)>,
{
    let lab = bosun_lab::ensure_lab().await?;
    let world = World::new(&lab, test).await?;
    let (world, result) = body(world).await;
    let logs = world.procs.logs().to_path_buf();
    world.clean_up(result.is_ok()).await;
    result?;
    // The deployed controller's rights were enough: no call was refused on the way.
    let refused = bosun_e2e::identity::refusals_in_logs(&logs)?;
    ensure!(
        refused.is_empty(),
        "the controller, running as deploy/'s ServiceAccount, was refused API calls:\n{}",
        refused.join("\n")
    );
    Ok(())
}

/// A drain evicts through the eviction API: a free pod goes, a pod guarded by a
/// PodDisruptionBudget (minAvailable 1, one healthy pod: no disruption allowed, as computed
/// by the real disruption controller) is refused with 429 again and again; the DaemonSet's
/// pod (bound to the node like the scheduler would) and a mirror pod are left alone. At
/// `drain.timeoutSeconds` the task Blocks as DrainTimedOut with a message naming the pod and
/// the budget with its numbers, and the Operation Blocks with it; a Warning Event says so.
/// The controller is killed mid-drain: its successor continues the same drain (same start,
/// same deadline, one attempt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_evicts_pods_respects_a_pdb_then_times_out_with_a_blocked_message_naming_pod_and_budget()
-> Result<()> {
    with_world("drain-pdb", |mut w| async move {
        let r: Result<()> = async {
            let node = w.node("a", true).await?;
            let ns = w.namespace().await?;
            let c = w.client.clone();
            create_pod(&c, &ns, pod("free-1", &node, json!({ "app": "free" }))).await?;
            create_pod(&c, &ns, pod("guarded-1", &node, json!({ "app": "guarded" }))).await?;
            let mut mirror = pod("static-web", &node, json!({ "app": "static" }));
            mirror["metadata"]["annotations"] = json!({ "kubernetes.io/config.mirror": "e2e" });
            create_pod(&c, &ns, mirror).await?;
            for p in ["free-1", "guarded-1", "static-web"] {
                mark_running(&c, &ns, p).await?;
            }
            // A real DaemonSet whose controller makes a pod for the node; bound here as the
            // scheduler would bind it.
            let ds = json!({
                "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": { "name": "agent", "namespace": ns },
                "spec": {
                    "selector": { "matchLabels": { "app": "ds" } },
                    "template": { "metadata": { "labels": { "app": "ds" } }, "spec": {
                        "nodeSelector": { INSTANCE_LABEL: w.instance }, "terminationGracePeriodSeconds": 0,
                        "containers": [{ "name": "c", "image": "registry.invalid/none" }] } },
                },
            });
            let dss: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::namespaced(c.clone(), &ns);
            dss.patch("agent", &PatchParams::apply(MANAGER), &Patch::Apply(ds)).await.context("creating the DaemonSet")?;
            let pods: Api<Pod> = Api::namespaced(c.clone(), &ns);
            let ds_pod = w
                .wait("the DaemonSet controller to create its pod", "", || {
                    let pods = pods.clone();
                    async move { Ok(pods.list(&ListParams::default().labels("app=ds")).await?.items.into_iter().next().map(|p| p.name_any())) }
                })
                .await?;
            let binding = json!({ "apiVersion": "v1", "kind": "Binding", "metadata": { "name": ds_pod }, "target": { "apiVersion": "v1", "kind": "Node", "name": node } });
            pods.create_subresource::<_, serde_json::Value>("binding", &ds_pod, &PostParams::default(), &binding)
                .await
                .context("binding the DaemonSet's pod to the node")?;
            let pdb = json!({
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": { "name": "guard", "namespace": ns },
                "spec": { "minAvailable": 1, "selector": { "matchLabels": { "app": "guarded" } } },
            });
            let pdbs: Api<PodDisruptionBudget> = Api::namespaced(c.clone(), &ns);
            pdbs.patch("guard", &PatchParams::apply(MANAGER), &Patch::Apply(pdb)).await.context("creating the PodDisruptionBudget")?;
            // The disruption controller (kube-controller-manager) computes the budget.
            w.wait("the disruption controller to compute the budget: 1 healthy, 0 disruptions allowed", "", || {
                let pdbs = pdbs.clone();
                async move {
                    let s = pdbs.get("guard").await?.status;
                    Ok(s.filter(|s| s.observed_generation == Some(1) && s.current_healthy == 1 && s.desired_healthy == 1 && s.disruptions_allowed == 0).map(|_| ()))
                }
            })
            .await?;
            w.start_controller("controller")?;

            let op = w
                .operation(
                    "drain",
                    json!([{ "name": "drain", "runsOn": "controller", "action": "drain" }]),
                    json!({ "drain": { "timeoutSeconds": 10, "evictUnmanagedPods": true } }),
                )
                .await?;
            // In progress: the free pod is gone, the guarded one is waited for, by name.
            let guard = format!("PodDisruptionBudget {ns}/guard");
            let running = w
                .wait_task(&op, &node, "drain Running and waiting for the guarded pod", |t| {
                    step(t, "drain").is_some_and(|s| s.phase == StepPhase::Running && s.message.as_deref().is_some_and(|m| m.contains("guarded-1") && m.contains(&guard)))
                })
                .await?;
            let waiting = step(&running, "drain").and_then(|s| s.message.clone()).unwrap_or_default();
            ensure!(!pod_exists(&c, &ns, "free-1").await?, "the free pod was evicted while the drain waits");
            ensure!(!waiting.contains("static-web") && !waiting.contains(&ds_pod), "the mirror and DaemonSet pods are not waited for: {waiting}");
            let nodes: Api<Node> = Api::all(c.clone());
            ensure!(nodes.get(&node).await?.spec.and_then(|s| s.unschedulable) == Some(true), "the drain cordoned the node first");
            // The controller dies mid-drain (SIGKILL: the Lease is not released); the next one
            // takes over once the Lease expires and carries on with the same drain: same start,
            // same deadline, same attempt.
            let started = step(&running, "drain").and_then(|s| s.started_at.clone()).context("the drain's startedAt")?;
            w.procs.kill("controller")?;
            w.start_controller("controller-2")?;

            let blocked = w.wait_task(&op, &node, "Blocked", |t| t.status.as_ref().is_some_and(|s| s.phase == NodeTaskPhase::Blocked)).await?;
            let s = blocked.status.clone().unwrap_or_default();
            let message = s.message.clone().unwrap_or_default();
            ensure!(s.reason == Some(BlockReason::DrainTimedOut), "reason {:?}: {message}", s.reason);
            for needle in ["did not finish within 10s", &format!("{ns}/guarded-1"), &format!("{guard} (1 healthy, 1 required, 0 disruptions allowed)"), "recovery: Retry"] {
                ensure!(message.contains(needle), "the Blocked message names {needle:?}: {message}");
            }
            ensure!(!message.contains("free-1") && !message.contains("static-web") && !message.contains(&ds_pod), "only the pod that held the drain is named: {message}");
            let drain = step(&blocked, "drain").context("drain step status")?;
            ensure!(drain.phase == StepPhase::Failed && drain.error.as_ref().is_some_and(|e| e.code == "drain-timeout"), "the step failed with code drain-timeout: {drain:?}");
            ensure!(drain.started_at.as_ref() == Some(&started) && drain.attempts == 1, "the new controller continued the same drain: {drain:?}");
            let operation = w.wait_phase(&op, OperationPhase::Blocked).await?;
            let os = operation.status.unwrap_or_default();
            ensure!(os.message.as_deref().is_some_and(|m| m.contains(&guard)), "the Operation's message carries the reason: {:?}", os.message);
            ensure!(os.conditions.iter().any(|c| c.type_ == "Blocked" && c.status == "True" && c.reason == "DrainTimedOut"), "Blocked condition: {:?}", os.conditions);
            for p in ["guarded-1", "static-web", ds_pod.as_str()] {
                ensure!(pod_exists(&c, &ns, p).await?, "pod {p} is still on the node");
            }
            let events = events_about(&c, &blocked.name_any(), None).await?;
            ensure!(
                events.iter().any(|e| e.reason.as_deref() == Some("Blocked") && e.type_.as_deref() == Some("Warning") && e.note.as_deref().is_some_and(|n| n.contains("DrainTimedOut"))),
                "a Warning Blocked Event names DrainTimedOut: {:?}",
                reasons(&events)
            );
            Ok(())
        }
        .await;
        (w, r)
    })
    .await
}

/// Pods that would be lost (managed by no controller) stop a drain at once unless the
/// Operation allows them: the task Blocks as StepFailed naming the pod and the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_refuses_a_bare_pod_unless_evict_unmanaged_pods_is_set() -> Result<()> {
    with_world("drain-bare", |mut w| async move {
        let r: Result<()> = async {
            let node = w.node("a", true).await?;
            let ns = w.namespace().await?;
            create_pod(
                &w.client,
                &ns,
                pod("bare-1", &node, json!({ "app": "bare" })),
            )
            .await?;
            w.start_controller("controller")?;
            let op = w
                .operation(
                    "bare",
                    json!([{ "name": "drain", "runsOn": "controller", "action": "drain" }]),
                    json!({}),
                )
                .await?;
            let blocked = w
                .wait_task(&op, &node, "Blocked", |t| {
                    t.status
                        .as_ref()
                        .is_some_and(|s| s.phase == NodeTaskPhase::Blocked)
                })
                .await?;
            let s = blocked.status.unwrap_or_default();
            let message = s.message.unwrap_or_default();
            ensure!(
                s.reason == Some(BlockReason::StepFailed),
                "reason {:?}: {message}",
                s.reason
            );
            ensure!(
                message.contains(&format!("{ns}/bare-1")) && message.contains("evictUnmanagedPods"),
                "{message}"
            );
            ensure!(
                pod_exists(&w.client, &ns, "bare-1").await?,
                "the bare pod was not evicted"
            );
            Ok(())
        }
        .await;
        (w, r)
    })
    .await
}

/// A drain that can finish: the pod is evicted, the mirror pod stays, the node is uncordoned
/// by the next step, and Events record the task's Started, Drained and Succeeded and the
/// Operation's Started and Succeeded, from Bosun's controller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_succeeds_and_events_are_visible_for_the_operation_and_the_node_task() -> Result<()> {
    with_world("events", |mut w| async move {
        let r: Result<()> = async {
            let node = w.node("a", true).await?;
            let ns = w.namespace().await?;
            let c = w.client.clone();
            create_pod(&c, &ns, pod("web-1", &node, json!({ "app": "web" }))).await?;
            let mut mirror = pod("static-web", &node, json!({ "app": "static" }));
            mirror["metadata"]["annotations"] = json!({ "kubernetes.io/config.mirror": "e2e" });
            create_pod(&c, &ns, mirror).await?;
            mark_running(&c, &ns, "web-1").await?;
            w.start_controller("controller")?;
            let op = w
                .operation(
                    "events",
                    json!([
                        { "name": "drain", "runsOn": "controller", "action": "drain" },
                        { "name": "uncordon", "runsOn": "controller", "action": "uncordon" },
                    ]),
                    json!({ "drain": { "evictUnmanagedPods": true } }),
                )
                .await?;
            w.wait_phase(&op, OperationPhase::Succeeded).await?;
            let task = tasks_of(&c, &op).await?.remove(&node).context("the task")?;
            let drained = step(&task, "drain")
                .and_then(|s| s.message.clone())
                .unwrap_or_default();
            ensure!(
                drained
                    == format!(
                        "node {node} drained; evicted {ns}/web-1; left {ns}/static-web (static pod)"
                    ),
                "{drained}"
            );
            ensure!(
                !pod_exists(&c, &ns, "web-1").await? && pod_exists(&c, &ns, "static-web").await?,
                "web-1 evicted, the mirror pod left"
            );
            let nodes: Api<Node> = Api::all(c.clone());
            ensure!(
                !nodes
                    .get(&node)
                    .await?
                    .spec
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false),
                "uncordoned at the end"
            );

            let tn = task.name_any();
            let (c2, tn2, op2) = (c.clone(), tn.clone(), op.clone());
            let (task_events, op_events) = w
                .wait(
                    "Events for the task (Drained) and the Operation (Started, Succeeded)",
                    &op,
                    || {
                        let (c, tn, op) = (c2.clone(), tn2.clone(), op2.clone());
                        async move {
                            let t = events_about(&c, &tn, None).await?;
                            let o = events_about(&c, &op, None).await?;
                            let want_t: BTreeSet<String> = ["Drained"].map(String::from).into();
                            let want_o: BTreeSet<String> =
                                ["Started", "Succeeded"].map(String::from).into();
                            Ok((reasons(&t).is_superset(&want_t)
                                && reasons(&o).is_superset(&want_o))
                            .then_some((t, o)))
                        }
                    },
                )
                .await?;
            // The task's routine start and success are in its status, not Events (written
            // with the Operation's Succeeded, so they would be listed by now).
            ensure!(
                reasons(&task_events) == BTreeSet::from(["Drained".to_string()]),
                "the task's only Event is Drained: {:?}",
                reasons(&task_events)
            );
            for e in task_events.iter().chain(&op_events) {
                ensure!(
                    e.reporting_controller.as_deref() == Some("bosun.dev/controller")
                        && e.reporting_instance.as_deref() == Some("controller"),
                    "reported by this controller: {e:?}"
                );
            }
            let drained_event = task_events
                .iter()
                .find(|e| e.reason.as_deref() == Some("Drained"))
                .context("Drained event")?;
            ensure!(
                drained_event.note.as_deref() == Some(drained.as_str()),
                "the Drained Event says what the step says: {:?}",
                drained_event.note
            );
            ensure!(
                task_events
                    .iter()
                    .all(|e| e.type_.as_deref() == Some("Normal")),
                "no warnings on a clean run"
            );
            Ok(())
        }
        .await;
        (w, r)
    })
    .await
}

/// Health gates between nodes: the first node's steps succeed but it reports NotReady, so its
/// task stays Running (the HealthGates condition says why) and the second node does not
/// start; after `timeoutSeconds` the task Blocks as HealthGateFailed with the node's own
/// reason. Once the node is Ready again, `recovery: Retry` waits afresh, the gates pass, and
/// the rollout moves on to the second node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_gate_blocks_when_the_node_is_not_ready_and_holds_the_next_node() -> Result<()> {
    with_world("gates", |mut w| async move {
        let r: Result<()> = async {
            let sick = w.node("a", false).await?;
            let next = w.node("b", true).await?;
            w.start_controller("controller")?;
            let op = w
                .operation(
                    "gates",
                    json!([{ "name": "cordon", "runsOn": "controller", "action": "cordon" }, { "name": "uncordon", "runsOn": "controller", "action": "uncordon" }]),
                    json!({ "rollout": { "maxUnavailable": 1 }, "healthGates": { "nodeReady": true, "apiServer": true, "timeoutSeconds": 8 } }),
                )
                .await?;
            let waiting = w
                .wait_task(&op, &sick, "steps done, HealthGates Waiting", |t| {
                    t.status.as_ref().is_some_and(|s| s.phase == NodeTaskPhase::Running && s.conditions.iter().any(|c| c.type_ == "HealthGates" && c.reason == "Waiting"))
                })
                .await?;
            ensure!(waiting.status.as_ref().unwrap().steps.iter().all(|s| s.phase == StepPhase::Succeeded), "the steps themselves succeeded");
            let blocked = w.wait_task(&op, &sick, "Blocked", |t| t.status.as_ref().is_some_and(|s| s.phase == NodeTaskPhase::Blocked)).await?;
            let s = blocked.status.clone().unwrap_or_default();
            let message = s.message.clone().unwrap_or_default();
            ensure!(s.reason == Some(BlockReason::HealthGateFailed), "reason {:?}: {message}", s.reason);
            ensure!(
                message.contains("within 8s") && message.contains(&format!("node {sick} is not Ready (Ready=False, KubeletNotReady: container runtime is down)")),
                "the message says which gate and why: {message}"
            );
            let gate = s.conditions.iter().find(|c| c.type_ == "HealthGates").context("HealthGates condition")?;
            ensure!(gate.status == "False" && gate.reason == "Failed", "{gate:?}");
            w.wait_phase(&op, OperationPhase::Blocked).await?;
            let held = tasks_of(&w.client, &op).await?.remove(&next).context("the next node's task")?;
            ensure!(held.status.as_ref().map(|s| s.phase).unwrap_or_default() == NodeTaskPhase::Pending, "the next node waits: {:?}", held.status);

            // Fix the cause, then retry: the gates wait afresh and pass.
            set_node_ready(&w.client, &sick, true).await?;
            let tasks: Api<NodeTask> = Api::all(w.client.clone());
            tasks
                .patch(&blocked.name_any(), &PatchParams::default(), &Patch::Merge(json!({ "spec": { "recovery": "Retry" } })))
                .await
                .context("setting recovery: Retry")?;
            w.wait_phase(&op, OperationPhase::Succeeded).await?;
            let all = tasks_of(&w.client, &op).await?;
            for (n, t) in &all {
                let s = t.status.clone().unwrap_or_default();
                ensure!(s.phase == NodeTaskPhase::Succeeded, "{n}: {s:?}");
                ensure!(s.conditions.iter().any(|c| c.type_ == "HealthGates" && c.reason == "Passed" && c.status == "True"), "{n}: gates recorded as passed");
            }
            Ok(())
        }
        .await;
        (w, r)
    })
    .await
}

/// The leader Lease's holder, if any.
async fn lease_holder(client: &Client, name: &str) -> Result<Option<(String, i32)>> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    Ok(leases
        .get_opt(name)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| {
            s.holder_identity
                .filter(|h| !h.is_empty())
                .map(|h| (h, s.lease_transitions.unwrap_or(0)))
        }))
}

/// Two controllers of one instance share a Lease: only the holder acts (every Event of an
/// Operation comes from it); when the holder is killed (SIGKILL, no release), the standby
/// takes the Lease once it has expired and carries on with the next Operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_election_only_the_lease_holder_acts_and_the_standby_takes_over_when_it_dies()
-> Result<()> {
    with_world("leader", |mut w| async move {
        let r: Result<()> = async {
            let node = w.node("a", true).await?;
            let lease = format!("bosun-controller-{}", w.instance);
            w.start_controller("one")?;
            w.start_controller("two")?;
            let c = w.client.clone();
            let (c2, l2) = (c.clone(), lease.clone());
            let (leader, transitions) = w.wait("a leader holds the Lease", "", || lease_holder_probe(c2.clone(), l2.clone())).await?;
            let standby = if leader == "one" { "two" } else { "one" };
            let steps = json!([{ "name": "cordon", "runsOn": "controller", "action": "cordon" }, { "name": "uncordon", "runsOn": "controller", "action": "uncordon" }]);

            let first = w.operation("leader-a", steps.clone(), json!({})).await?;
            w.wait_phase(&first, OperationPhase::Succeeded).await?;
            let first_task = tasks_of(&c, &first).await?.remove(&node).context("the first Operation's task")?;
            let (c3, f3, n3) = (c.clone(), first.clone(), first_task.name_any());
            let events = w
                .wait("Events of the first Operation", &first, || {
                    let (c, f, n) = (c3.clone(), f3.clone(), n3.clone());
                    async move {
                        let mut e = events_about(&c, &f, None).await?;
                        e.extend(events_about(&c, &n, None).await?);
                        Ok(reasons(&e).contains("Succeeded").then_some(e))
                    }
                })
                .await?;
            let actors: BTreeSet<String> = events.iter().filter_map(|e| e.reporting_instance.clone()).collect();
            ensure!(actors == BTreeSet::from([leader.clone()]), "only the leader {leader} acted; Events came from {actors:?}");
            ensure!(lease_holder(&c, &lease).await?.map(|h| h.0) == Some(leader.clone()), "the leader kept the Lease");

            w.procs.kill(&leader)?;
            let (c4, l4, s4) = (c.clone(), lease.clone(), standby.to_string());
            let (holder, after) = w
                .wait("the standby takes the Lease", "", || {
                    let (c, l, s) = (c4.clone(), l4.clone(), s4.clone());
                    async move { Ok(lease_holder(&c, &l).await?.filter(|(h, _)| *h == s)) }
                })
                .await?;
            ensure!(holder == standby && after == transitions + 1, "one transition to {standby}: {transitions} -> {after}");
            let second = w.operation("leader-b", steps, json!({})).await?;
            w.wait_phase(&second, OperationPhase::Succeeded).await?;
            let (c5, s5) = (c.clone(), second.clone());
            let events = w
                .wait("Events of the second Operation", &second, || {
                    let (c, s) = (c5.clone(), s5.clone());
                    async move {
                        let e = events_about(&c, &s, None).await?;
                        Ok(reasons(&e).contains("Succeeded").then_some(e))
                    }
                })
                .await?;
            let actors: BTreeSet<String> = events.iter().filter_map(|e| e.reporting_instance.clone()).collect();
            ensure!(actors == BTreeSet::from([standby.to_string()]), "the new leader {standby} acted; Events came from {actors:?}");
            Ok(())
        }
        .await;
        (w, r)
    })
    .await
}

/// A leader whose Lease is taken from it (written by hand to another holder, as a person or
/// a healed partition would) stands by again in the same process and sends no write after
/// that. The evidence is the API server's own audit log, by `User-Agent` (each replica's
/// names its identity): the old leader's writes all come before it logged the loss, and
/// before the Lease was taken plus its renew deadline (4 s − 1 s) (any attempt counts,
/// refused or not); no write of the standby was accepted, and the only ones it tried were on
/// the Lease (a create that lost the start race: 409). Meanwhile it was running a drain held by a PodDisruptionBudget (an
/// eviction refused again and again: writes it would go on sending). Once the Lease is
/// released, a replica takes it, and when the budget goes the drain finishes in its first
/// attempt. Neither process exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_loses_its_lease_stands_by_in_process_and_writes_nothing_after() -> Result<()>
{
    with_world("lease-lost", |mut w| async move {
        let r: Result<()> = async {
            let lab = bosun_lab::ensure_lab().await?;
            let node = w.node("a", true).await?;
            let ns = w.namespace().await?;
            let c = w.client.clone();
            create_pod(&c, &ns, pod("guarded-1", &node, json!({ "app": "guarded" }))).await?;
            mark_running(&c, &ns, "guarded-1").await?;
            let pdb = json!({
                "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": { "name": "guard", "namespace": ns },
                "spec": { "minAvailable": 1, "selector": { "matchLabels": { "app": "guarded" } } },
            });
            let pdbs: Api<PodDisruptionBudget> = Api::namespaced(c.clone(), &ns);
            pdbs.patch("guard", &PatchParams::apply(MANAGER), &Patch::Apply(pdb)).await.context("creating the PodDisruptionBudget")?;
            w.wait("the disruption controller to compute the budget", "", || {
                let pdbs = pdbs.clone();
                async move { Ok(pdbs.get("guard").await?.status.filter(|s| s.current_healthy == 1 && s.disruptions_allowed == 0).map(|_| ())) }
            })
            .await?;
            let lease = format!("bosun-controller-{}", w.instance);
            // Identities unique to this test: the audit log holds every test's writes.
            let (one, two) = (format!("one-{}", w.instance), format!("two-{}", w.instance));
            w.start_controller(&one)?;
            w.start_controller(&two)?;
            let (c2, l2) = (c.clone(), lease.clone());
            let (leader, _) = w.wait("a leader holds the Lease", "", || lease_holder_probe(c2.clone(), l2.clone())).await?;
            let standby = if leader == one { two.clone() } else { one.clone() };
            let op = w
                .operation(
                    "lease-lost",
                    json!([{ "name": "drain", "runsOn": "controller", "action": "drain" }]),
                    json!({ "drain": { "timeoutSeconds": 600, "evictUnmanagedPods": true } }),
                )
                .await?;
            w.wait_task(&op, &node, "drain Running, held by the budget", |t| {
                step(t, "drain").is_some_and(|s| s.phase == StepPhase::Running && s.message.as_deref().is_some_and(|m| m.contains("guarded-1")))
            })
            .await?;
            let suffix = |who: &str| bosun_e2e::audit::identity_suffix(who);
            let by = |writes: &[bosun_e2e::audit::Write], who: &str| -> Vec<bosun_e2e::audit::Write> {
                writes.iter().filter(|x| x.user_agent.ends_with(&suffix(who))).cloned().collect()
            };
            // The check below can fail: the audit log sees this leader's writes.
            let before = bosun_e2e::audit::writes(&lab)?;
            ensure!(!by(&before, &leader).is_empty(), "the audit log records the leader {leader}'s writes (User-Agent ending {})", suffix(&leader));

            // Take the Lease by hand, for an hour.
            let leases: Api<Lease> = Api::namespaced(c.clone(), LEASE_NAMESPACE);
            let mut conflicts = 0;
            let taken = loop {
                let mut current = leases.get(&lease).await?;
                let taken = k8s_openapi::jiff::Timestamp::now();
                if let Some(spec) = current.spec.as_mut() {
                    spec.holder_identity = Some("e2e-by-hand".into());
                    spec.lease_duration_seconds = Some(3600);
                    spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(taken));
                }
                match leases.replace(&lease, &PostParams::default(), &current).await {
                    Ok(_) => break taken,
                    // The leader renewed it between the read and the write: read it again.
                    Err(kube::Error::Api(s)) if s.code == 409 && conflicts < 10 => conflicts += 1,
                    Err(e) => return Err(anyhow::Error::new(e).context("taking the Lease by hand")),
                }
            };
            let log = w.procs.log_of(&leader);
            let lost_line = w
                .wait("the old leader to log that it lost the Lease", &op, || {
                    let log = log.clone();
                    async move {
                        let text = std::fs::read_to_string(&log).unwrap_or_default();
                        Ok(text.lines().find(|l| l.contains("lost the leader lease")).map(str::to_string))
                    }
                })
                .await?;
            let lost_at: k8s_openapi::jiff::Timestamp = lost_line
                .split_whitespace()
                .next()
                .and_then(|t| t.parse().ok())
                .with_context(|| format!("the time of the log line {lost_line:?}"))?;
            // Give the old leader time to misbehave: its drain retries evictions every few
            // seconds, and it renewed every second.
            tokio::time::sleep(Duration::from_secs(8)).await;
            w.procs.check_alive()?;
            let writes = bosun_e2e::audit::writes(&lab)?;
            let deadline = taken + k8s_openapi::jiff::SignedDuration::from_secs(3);
            let late: Vec<String> = by(&writes, &leader)
                .iter()
                .filter(|x| x.received >= lost_at || x.received >= deadline)
                .map(ToString::to_string)
                .collect();
            ensure!(late.is_empty(), "the old leader {leader} wrote after it lost the Lease (taken at {taken}, loss logged at {lost_at}):\n{}", late.join("\n"));
            // The standby never led: no write of it was accepted, and the only ones it tried
            // were on the Lease (a create that lost the race to the other replica: 409).
            let standby_writes: Vec<String> = by(&writes, &standby)
                .iter()
                .filter(|x| x.code.is_some_and(|c| (200..300).contains(&c)) || !x.object.starts_with("leases "))
                .map(ToString::to_string)
                .collect();
            ensure!(standby_writes.is_empty(), "the standby {standby} never led and wrote nothing:\n{}", standby_writes.join("\n"));
            let text = std::fs::read_to_string(&log)?;
            ensure!(text.contains("standing by"), "the old leader stood by again: see {}", log.display());

            // Released: a replica takes the Lease and carries on with the same drain.
            let mut current = leases.get(&lease).await?;
            if let Some(spec) = current.spec.as_mut() {
                spec.holder_identity = None;
                spec.lease_duration_seconds = Some(1);
            }
            leases.replace(&lease, &PostParams::default(), &current).await.context("releasing the Lease")?;
            let (c3, l3) = (c.clone(), lease.clone());
            let (next, _) = w.wait("a replica takes the released Lease", &op, || lease_holder_probe(c3.clone(), l3.clone())).await?;
            ensure!(next == one || next == two, "a controller took the Lease, not {next}");
            pdbs.delete("guard", &DeleteParams::default()).await.context("deleting the budget")?;
            w.wait_phase(&op, OperationPhase::Succeeded).await?;
            let task = tasks_of(&c, &op).await?.remove(&node).context("the task")?;
            let drain = step(&task, "drain").context("the drain's status")?;
            ensure!(drain.attempts == 1, "the drain ran once across the change of leader: {drain:?}");
            w.procs.check_alive()?;
            Ok(())
        }
        .await;
        (w, r)
    })
    .await
}

async fn lease_holder_probe(client: Client, lease: String) -> Result<Option<(String, i32)>> {
    lease_holder(&client, &lease).await
}

/// `ttlSecondsAfterFinished`: a finished Operation with a TTL is deleted after it, and its
/// NodeTasks go with it (owner references, the real garbage collector); an Operation
/// without a TTL that finished earlier is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_deletes_a_finished_operation_and_its_node_tasks_and_nothing_else() -> Result<()> {
    with_world("ttl", |mut w| async move {
        let r: Result<()> = async {
            let node = w.node("a", true).await?;
            w.start_controller("controller")?;
            let steps =
                json!([{ "name": "uncordon", "runsOn": "controller", "action": "uncordon" }]);
            let kept = w.operation("keep", steps.clone(), json!({})).await?;
            w.wait_phase(&kept, OperationPhase::Succeeded).await?;
            let doomed = w
                .operation("ttl", steps, json!({ "ttlSecondsAfterFinished": 3 }))
                .await?;
            let finished = w.wait_phase(&doomed, OperationPhase::Succeeded).await?;
            ensure!(
                finished.status.and_then(|s| s.completion_time).is_some(),
                "completionTime set"
            );
            let (c, d) = (w.client.clone(), doomed.clone());
            w.wait(
                "the Operation with a TTL and its NodeTasks deleted",
                &doomed,
                || {
                    let (c, d) = (c.clone(), d.clone());
                    async move {
                        let ops: Api<Operation> = Api::all(c.clone());
                        let gone =
                            ops.get_opt(&d).await?.is_none() && tasks_of(&c, &d).await?.is_empty();
                        Ok(gone.then_some(()))
                    }
                },
            )
            .await?;
            let ops: Api<Operation> = Api::all(w.client.clone());
            ensure!(
                ops.get_opt(&kept).await?.is_some(),
                "the Operation without a TTL is kept"
            );
            ensure!(
                tasks_of(&w.client, &kept).await?.contains_key(&node),
                "and so is its NodeTask"
            );
            Ok(())
        }
        .await;
        (w, r)
    })
    .await
}
