//! The operator's real processes, scoped to one test: a `bosun-controller` and one
//! `bosun-agent` per lab node, all started with `--instance <name>`, so they act only on
//! Operations labelled `bosun.dev/instance=<name>` and on the NodeTasks made from them.
//! Several tests (threads of one binary, or other helpers' binaries) can run their own
//! operators against one lab without touching each other's objects.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bosun_api::node_task::NodeTask;
use bosun_api::operation::{Operation, OperationPhase};
use bosun_lab::LabHandle;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::cluster::signing_key;
use crate::{DEADLINE, MANAGER, Processes, binary, target_dir, unique};

/// The label that scopes Operations and NodeTasks to one controller/agents install
/// (the binaries' `--instance`).
pub const INSTANCE_LABEL: &str = "bosun.dev/instance";

/// How often the waits poll the API server.
const POLL: Duration = Duration::from_millis(250);

/// A controller and its agents for one test, and what the test needs to drive them.
/// Dropping it kills the processes.
pub struct Operator {
    /// The instance name: the label value of this test's Operations and NodeTasks.
    pub instance: String,
    pub client: Client,
    /// The processes: `controller` and `agent-<node>`.
    pub procs: Processes,
    /// This test's directory: logs, the agents' plugin stores.
    pub dir: PathBuf,
    kubeconfig: PathBuf,
    trust_root: PathBuf,
    nodes: Vec<(String, PathBuf)>,
    agent_args: Vec<String>,
    controller_args: Vec<String>,
    /// The kubeconfig the controller runs with, when not the lab's.
    controller_kubeconfig: Option<PathBuf>,
}

impl Operator {
    /// Starts the controller and one agent per lab node for a new instance named after
    /// `test`. The CRDs and the plugins the test uses must already be there
    /// ([`crate::apply_crds`], [`crate::publish_plugin`]).
    pub fn start(lab: &LabHandle, test: &str) -> Result<Operator> {
        Operator::start_with_agent_args(lab, test, &[])
    }

    /// [`start`](Self::start) with extra arguments for every agent (and its restarts),
    /// such as `--plugin-ca-file` or `--insecure-registry`.
    pub fn start_with_agent_args(
        lab: &LabHandle,
        test: &str,
        agent_args: &[String],
    ) -> Result<Operator> {
        Operator::start_with_args(lab, test, &[], agent_args)
    }

    /// [`start`](Self::start) with extra arguments for the controller and for every agent
    /// (and their restarts), such as `--lifecycle true`.
    pub fn start_with_args(
        lab: &LabHandle,
        test: &str,
        controller_args: &[String],
        agent_args: &[String],
    ) -> Result<Operator> {
        Operator::start_with(lab, test, controller_args, agent_args, None)
    }

    /// [`start`](Self::start) with the controller reaching the API server through
    /// `kubeconfig` (for example one whose server is a relay:
    /// [`crate::stall::StallingRelay::kubeconfig`]); the agents use the lab's.
    pub fn start_with_controller_kubeconfig(
        lab: &LabHandle,
        test: &str,
        kubeconfig: &Path,
    ) -> Result<Operator> {
        Operator::start_with(lab, test, &[], &[], Some(kubeconfig.to_path_buf()))
    }

    /// [`start`](Self::start) with extra arguments for the controller and the agents, and
    /// the controller reaching the API server through `controller_kubeconfig` when given.
    pub fn start_with(
        lab: &LabHandle,
        test: &str,
        controller_args: &[String],
        agent_args: &[String],
        controller_kubeconfig: Option<PathBuf>,
    ) -> Result<Operator> {
        let instance = unique(test);
        let dir = target_dir().join("e2e-operator").join(&instance);
        let procs = Processes::new(&dir)?;
        let (_, trust_root) = signing_key()?;
        let mut op = Operator {
            instance,
            client: lab.client.clone(),
            procs,
            dir,
            kubeconfig: lab.kubeconfig.clone(),
            trust_root,
            nodes: lab
                .nodes
                .iter()
                .map(|n| (n.name.clone(), n.host_root.clone()))
                .collect(),
            agent_args: agent_args.to_vec(),
            controller_args: controller_args.to_vec(),
            controller_kubeconfig,
        };
        op.start_controller()?;
        for (node, _) in op.nodes.clone() {
            op.start_agent(&node)?;
        }
        Ok(op)
    }

    /// Starts (or, after [`kill`](Self::kill), restarts) the controller.
    pub fn start_controller(&mut self) -> Result<()> {
        let mut cmd = Command::new(binary("bosun-controller")?);
        let kubeconfig = self.controller_kubeconfig.as_ref();
        cmd.env("KUBECONFIG", kubeconfig.unwrap_or(&self.kubeconfig))
            .env("BOSUN_LOG", "info,kube=warn")
            .arg("--instance")
            .arg(&self.instance)
            // Short resync: a requeue is the only clock the controller has (backoff,
            // retries), and the tests should not wait on the 30 s default.
            .args(["--resync-seconds", "2"])
            .args(&self.controller_args);
        self.procs.spawn("controller", &mut cmd)
    }

    /// Starts (or restarts) the agent of `node`, with its own plugin store in this test's
    /// directory.
    pub fn start_agent(&mut self, node: &str) -> Result<()> {
        let root = self
            .nodes
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, r)| r.clone())
            .with_context(|| format!("{node} is not a lab node"))?;
        let mut cmd = Command::new(binary("bosun-agent")?);
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .env("BOSUN_LOG", "info,kube=warn")
            .arg("--instance")
            .arg(&self.instance)
            .arg("--node-name")
            .arg(node)
            .arg("--host-root")
            .arg(&root)
            .arg("--trust-root")
            .arg(&self.trust_root)
            .arg("--plugin-dir")
            .arg(self.dir.join(format!("plugins-{node}")))
            .args(&self.agent_args);
        self.procs.spawn(&agent_name(node), &mut cmd)
    }

    /// Starts an agent, like the others', for a node added after the start (for example a
    /// fleet node whose root a test prepared).
    pub fn add_node(&mut self, node: &str, host_root: &Path) -> Result<()> {
        self.nodes.push((node.to_owned(), host_root.to_path_buf()));
        self.start_agent(node)
    }

    /// SIGKILLs a process: `controller` or `agent-<node>` (see [`agent_name`]).
    pub fn kill(&mut self, name: &str) -> Result<()> {
        self.procs.kill(name)
    }

    /// Ends a test that passed: deletes every Operation labelled with this instance (the
    /// lab's garbage collector then removes their NodeTasks, which they own) and stops the
    /// processes. The lab outlives test runs, so without this each run would leave its
    /// Operations behind. A failing test returns before it gets here and leaves its objects
    /// for inspection (`kubectl get operations -l bosun.dev/instance=<name>`).
    pub async fn finish(self) -> Result<()> {
        delete_instance_operations(&self.client, &self.instance).await
    }

    /// The Operation object for `spec`, named `name` and labelled with this instance.
    pub fn operation(&self, name: &str, spec: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation",
            "metadata": { "name": name, "labels": { INSTANCE_LABEL: self.instance } },
            "spec": spec,
        })
    }

    /// Creates an Operation with a unique name starting with `prefix` and returns the name.
    pub async fn create_operation(&self, prefix: &str, spec: serde_json::Value) -> Result<String> {
        let name = unique(prefix);
        let ops: Api<Operation> = Api::all(self.client.clone());
        ops.patch(
            &name,
            &PatchParams::apply(MANAGER),
            &Patch::Apply(self.operation(&name, spec)),
        )
        .await
        .with_context(|| format!("creating Operation {name}"))?;
        Ok(name)
    }

    /// Merge-patches an Operation's spec (`paused`, …), as a person with kubectl would.
    pub async fn patch_operation_spec(&self, name: &str, spec: serde_json::Value) -> Result<()> {
        let ops: Api<Operation> = Api::all(self.client.clone());
        ops.patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .with_context(|| format!("patching the spec of Operation {name} with {spec}"))?;
        Ok(())
    }

    /// Merge-patches a NodeTask's spec (`approve`, `recovery`), as a person with kubectl would.
    pub async fn patch_task_spec(&self, task: &str, spec: serde_json::Value) -> Result<()> {
        let api: Api<NodeTask> = Api::all(self.client.clone());
        api.patch(
            task,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .with_context(|| format!("patching the spec of NodeTask {task} with {spec}"))?;
        Ok(())
    }

    /// The NodeTasks of Operation `op`, by node name.
    pub async fn tasks(&self, op: &str) -> Result<BTreeMap<String, NodeTask>> {
        tasks_of(&self.client, op).await
    }

    /// The NodeTask of Operation `op` on `node`.
    /// The tasks of `op`, after checking there are `count` of them and that every task and
    /// every step of each Succeeded in one attempt (no step ran twice).
    pub async fn tasks_each_run_once(
        &self,
        op: &str,
        count: usize,
    ) -> Result<BTreeMap<String, NodeTask>> {
        use bosun_api::node_task::{NodeTaskPhase, StepPhase};
        let tasks = self.tasks(op).await?;
        anyhow::ensure!(tasks.len() == count, "{count} tasks: {tasks:?}");
        for (node, task) in &tasks {
            let s = task.status.clone().unwrap_or_default();
            anyhow::ensure!(
                (s.phase, s.attempts) == (NodeTaskPhase::Succeeded, 1),
                "{node}: {:?} after {} attempts",
                s.phase,
                s.attempts
            );
            for st in &s.steps {
                anyhow::ensure!(
                    (st.phase, st.attempts) == (StepPhase::Succeeded, 1),
                    "{node}: step {} {:?} after {} attempts: it ran more than once",
                    st.name,
                    st.phase,
                    st.attempts
                );
            }
        }
        Ok(tasks)
    }

    pub async fn task(&self, op: &str, node: &str) -> Result<NodeTask> {
        self.tasks(op)
            .await?
            .remove(node)
            .with_context(|| format!("Operation {op} has no NodeTask for {node}"))
    }

    /// Waits until Operation `name` satisfies `done` (`what` says what is awaited, for the
    /// failure message). Fails when a process of this operator exits, or at [`DEADLINE`]
    /// with the Operation's phase and message, every task's status and where the logs are.
    pub async fn wait_operation(
        &mut self,
        name: &str,
        what: &str,
        done: impl Fn(&Operation) -> bool,
    ) -> Result<Operation> {
        let ops: Api<Operation> = Api::all(self.client.clone());
        let started = Instant::now();
        loop {
            self.procs.check_alive()?;
            let op = ops
                .get_opt(name)
                .await
                .with_context(|| format!("getting Operation {name}"))?;
            if let Some(op) = op.as_ref().filter(|o| done(o)) {
                return Ok(op.clone());
            }
            if started.elapsed() >= DEADLINE {
                bail!(
                    "{}",
                    self.timeout_report(&format!("Operation {name}: {what}"), name, op.as_ref())
                        .await
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until Operation `name` no longer exists (a foreground deletion finishes once
    /// the garbage collector removed its NodeTasks); fails like
    /// [`wait_operation`](Self::wait_operation).
    pub async fn wait_gone(&mut self, name: &str) -> Result<()> {
        let ops: Api<Operation> = Api::all(self.client.clone());
        let started = Instant::now();
        loop {
            self.procs.check_alive()?;
            let op = ops
                .get_opt(name)
                .await
                .with_context(|| format!("getting Operation {name}"))?;
            if op.is_none() {
                return Ok(());
            }
            if started.elapsed() >= DEADLINE {
                bail!(
                    "{}",
                    self.timeout_report(&format!("Operation {name}: deleted"), name, op.as_ref())
                        .await
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until the Operation is Succeeded, Failed or Blocked.
    pub async fn wait_settled(&mut self, name: &str) -> Result<Operation> {
        self.wait_operation(name, "phase Succeeded, Failed or Blocked", |o| {
            matches!(
                phase_of(o),
                OperationPhase::Succeeded | OperationPhase::Failed | OperationPhase::Blocked
            )
        })
        .await
    }

    /// Waits until Operation `name` settles and requires it Succeeded; otherwise fails with
    /// its phase and message, every task's status and where the logs are.
    pub async fn wait_succeeded(&mut self, name: &str) -> Result<Operation> {
        let op = self.wait_settled(name).await?;
        if phase_of(&op) != OperationPhase::Succeeded {
            let message = op.status.as_ref().and_then(|s| s.message.clone());
            bail!(
                "Operation {name} ended {:?}: {:?}\n{}logs in {}",
                phase_of(&op),
                message,
                describe_tasks(&self.client, name).await,
                self.dir.display()
            );
        }
        Ok(op)
    }

    /// Waits until the NodeTask of Operation `op` on `node` satisfies `done`; fails like
    /// [`wait_operation`](Self::wait_operation).
    pub async fn wait_task(
        &mut self,
        op: &str,
        node: &str,
        what: &str,
        done: impl Fn(&NodeTask) -> bool,
    ) -> Result<NodeTask> {
        let started = Instant::now();
        loop {
            self.procs.check_alive()?;
            if let Some(task) = self.tasks(op).await?.remove(node).filter(|t| done(t)) {
                return Ok(task);
            }
            if started.elapsed() >= DEADLINE {
                let ops: Api<Operation> = Api::all(self.client.clone());
                let current = ops.get_opt(op).await.ok().flatten();
                bail!(
                    "{}",
                    self.timeout_report(
                        &format!("NodeTask of {op} on {node}: {what}"),
                        op,
                        current.as_ref()
                    )
                    .await
                );
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn timeout_report(&self, what: &str, op: &str, current: Option<&Operation>) -> String {
        let mut out = format!("not reached within {DEADLINE:?}: {what}\n");
        match current {
            None => out.push_str("  the Operation does not exist\n"),
            Some(o) => {
                let s = o.status.clone().unwrap_or_default();
                let _ = writeln!(
                    out,
                    "  Operation phase {:?}, progress {:?}, message {:?}",
                    s.phase, s.progress, s.message
                );
            }
        }
        out.push_str(&describe_tasks(&self.client, op).await);
        let _ = write!(out, "  logs: {}", self.procs.logs().display());
        out
    }
}

impl std::fmt::Debug for Operator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operator")
            .field("instance", &self.instance)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// Deletes every Operation labelled with `instance` (the lab's garbage collector then
/// removes their NodeTasks, which they own).
pub async fn delete_instance_operations(client: &Client, instance: &str) -> Result<()> {
    let ops: Api<Operation> = Api::all(client.clone());
    let selector = format!("{INSTANCE_LABEL}={instance}");
    ops.delete_collection(
        &DeleteParams::background(),
        &ListParams::default().labels(&selector),
    )
    .await
    .with_context(|| format!("deleting the Operations labelled {selector}"))?;
    Ok(())
}

/// The process name of `node`'s agent.
pub fn agent_name(node: &str) -> String {
    format!("agent-{node}")
}

/// The Operation's phase (Pending when it has no status yet).
pub fn phase_of(op: &Operation) -> OperationPhase {
    op.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

/// The NodeTasks of Operation `op`, by node name.
pub async fn tasks_of(client: &Client, op: &str) -> Result<BTreeMap<String, NodeTask>> {
    let api: Api<NodeTask> = Api::all(client.clone());
    let list = api
        .list(&ListParams::default().labels(&format!("bosun.dev/operation={op}")))
        .await
        .with_context(|| format!("listing the NodeTasks of {op}"))?;
    Ok(list
        .items
        .into_iter()
        .map(|t| (t.spec.node_name.clone(), t))
        .collect())
}

/// Every NodeTask of `op` with its phase, reason, message and each step's phase, attempts,
/// times and message: what a failure message needs to be useful.
pub async fn describe_tasks(client: &Client, op: &str) -> String {
    let tasks = match tasks_of(client, op).await {
        Ok(t) => t,
        Err(e) => return format!("  (could not list the tasks: {e:#})\n"),
    };
    if tasks.is_empty() {
        return "  no NodeTasks\n".into();
    }
    let mut out = String::new();
    for (node, task) in tasks {
        let s = task.status.clone().unwrap_or_default();
        let _ = writeln!(
            out,
            "  {} ({node}): {:?} reason {:?} attempts {} approve {} recovery {:?}: {}",
            task.name_any(),
            s.phase,
            s.reason,
            s.attempts,
            task.spec.approve,
            task.spec.recovery,
            s.message.unwrap_or_default()
        );
        for step in &s.steps {
            let _ = writeln!(
                out,
                "    {}: {:?} attempts {} {:?}..{:?}: {}",
                step.name,
                step.phase,
                step.attempts,
                step.started_at.as_ref().map(|t| t.0.to_string()),
                step.finished_at.as_ref().map(|t| t.0.to_string()),
                step.message.clone().unwrap_or_default()
            );
        }
    }
    out
}

/// Every regular file under `root` with the SHA-256 of its bytes (and symlinks with their
/// targets), keyed by path relative to `root`: a fingerprint that changes when any byte,
/// file or link under the root does.
pub fn hash_tree(root: &Path) -> Result<BTreeMap<PathBuf, String>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, String>) -> Result<()> {
        for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            let entry = entry?;
            let path = entry.path();
            let kind = entry.file_type()?;
            let rel = path.strip_prefix(root)?.to_path_buf();
            if kind.is_symlink() {
                out.insert(
                    rel,
                    format!("symlink -> {}", std::fs::read_link(&path)?.display()),
                );
            } else if kind.is_dir() {
                out.insert(rel, "dir".into());
                walk(root, &path, out)?;
            } else {
                let bytes =
                    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
                out.insert(rel, bosun_trust::Digest::of(&bytes).to_string());
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out)?;
    Ok(out)
}
