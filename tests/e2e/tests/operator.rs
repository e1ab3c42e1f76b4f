//! The operator end to end: the real `bosun-controller` binary and one real `bosun-agent`
//! process per simulated node, against the lab's real kube-apiserver, running the real
//! `hello` wasm plugin (signed with a key made here, published through a ConfigMap).
//!
//! The controller and agent binaries are taken from the workspace's target directory
//! (`$CARGO_TARGET_DIR/debug`): a nested `cargo build` would wait forever on the lock of the
//! `cargo test` running this file. `cargo test --workspace` builds them first (both crates
//! have integration tests, so cargo builds their binaries); alone, run
//! `cargo build -p bosun-controller -p bosun-agent` before `cargo test -p bosun-e2e --test operator`.
//! The test refuses binaries older than their sources rather than test stale code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use bosun_api::node_task::{BlockReason, CheckStatus, NodeTask, NodeTaskPhase, StepPhase};
use bosun_api::operation::{Operation, OperationPhase};
use bosun_lab::{LabHandle, Role};
use bosun_trust::{Digest, SigningKey, Statement};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt};
use serde_json::json;

/// Upper bound for the cluster and the processes to do their work; reaching it fails the
/// test (it is not a performance assertion).
const DEADLINE: Duration = Duration::from_secs(240);
const MANAGER: &str = "bosun-e2e-operator";
const PLUGIN_NAMESPACE: &str = "bosun-system";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

/// A name no earlier run used (the lab's etcd outlives test runs).
fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().subsec_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

fn newest_mtime(dir: &Path) -> SystemTime {
    let mut newest = SystemTime::UNIX_EPOCH;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let t = if path.is_dir() { newest_mtime(&path) } else { entry.metadata().and_then(|m| m.modified()).unwrap_or(newest) };
        newest = newest.max(t);
    }
    newest
}

/// A workspace binary, refused when missing or older than the sources it is built from.
fn binary(name: &str) -> Result<PathBuf> {
    let path = target_dir().join("debug").join(name);
    let hint = "build it first: `cargo build -p bosun-controller -p bosun-agent` (cargo test --workspace does this)";
    let built = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .with_context(|| format!("{} not found; {hint}", path.display()))?;
    let root = workspace_root();
    for src in ["runtime/controller/src", "runtime/agent/src", "runtime/planner/src", "runtime/api/src", "runtime/host/src"] {
        let newest = newest_mtime(&root.join(src));
        ensure!(built >= newest, "{} is older than {src}; {hint}", path.display());
    }
    Ok(path)
}

/// Builds the hello plugin for wasm32-wasip2 in its own target directory (the one the CLI
/// tests use too, so it is usually already built).
fn hello_wasm() -> Result<Vec<u8>> {
    let dir = target_dir().join("cli-test-plugins");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(workspace_root())
        .env("CARGO_TARGET_DIR", &dir)
        .args(["build", "--release", "--target", "wasm32-wasip2", "-p", "bosun-plugin-hello"])
        .status()
        .context("running cargo to build the hello plugin")?;
    ensure!(status.success(), "building the hello plugin failed; is `rustup target add wasm32-wasip2` done?");
    let path = dir.join("wasm32-wasip2/release/bosun_plugin_hello.wasm");
    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
}

/// Child processes killed (and reaped) when the test ends, however it ends.
struct Processes {
    children: Vec<(String, Child)>,
    logs: PathBuf,
}

impl Processes {
    fn spawn(&mut self, name: &str, cmd: &mut Command) -> Result<()> {
        let log = std::fs::File::create(self.logs.join(format!("{name}.log")))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        self.children.push((name.to_string(), child));
        Ok(())
    }

    /// Fails if a process already exited (it would have left the test waiting).
    fn check_alive(&mut self) -> Result<()> {
        for (name, child) in &mut self.children {
            if let Some(status) = child.try_wait()? {
                bail!("{name} exited early with {status}; see {}", self.logs.join(format!("{name}.log")).display());
            }
        }
        Ok(())
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

async fn apply_crds(client: &Client) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let dir = workspace_root().join("deploy/crds");
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        let crd: CustomResourceDefinition = serde_yaml::from_str(&std::fs::read_to_string(&path)?)
            .with_context(|| format!("parsing {}", path.display()))?;
        let name = crd.name_any();
        crds.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&crd))
            .await
            .with_context(|| format!("applying {}", path.display()))?;
        tokio::time::timeout(DEADLINE, await_condition(crds.clone(), &name, conditions::is_crd_established()))
            .await
            .with_context(|| format!("CRD {name} not Established in time"))??;
    }
    Ok(())
}

/// Gives each node's host root what the hello plugin's grant names: `/usr/bin/uname`, and
/// the shared libraries it loads, since the agent runs granted commands chrooted into the
/// host root. Idempotent.
fn install_uname(lab: &LabHandle) -> Result<()> {
    let ldd = Command::new("ldd").arg("/usr/bin/uname").output().context("running ldd")?;
    let mut files = vec![PathBuf::from("/usr/bin/uname")];
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` or `/lib64/ld-linux... (0x...)`
        let path = line.split("=>").last().unwrap_or("").split_whitespace().next().unwrap_or("");
        if path.starts_with('/') {
            files.push(PathBuf::from(path));
        }
    }
    for node in &lab.nodes {
        for file in &files {
            let dest = node.host_root.join(file.strip_prefix("/")?);
            std::fs::create_dir_all(dest.parent().unwrap())?;
            std::fs::copy(file, &dest).with_context(|| format!("copying {} to {}", file.display(), dest.display()))?;
        }
    }
    Ok(())
}

/// Signs and publishes the hello plugin: a ConfigMap with its bytes and the `hello`
/// Plugin resource pinning its digest, with exactly the grants it needs. Returns the trust
/// root file the agents are given.
async fn publish_hello(client: &Client, dir: &Path) -> Result<PathBuf> {
    let wasm = hello_wasm()?;
    let digest = Digest::of(&wasm);
    let version = "0.1.0";
    let key = SigningKey::generate_ed25519();
    let signature = key.sign_statement(&Statement::new("hello", version, digest)?);
    let trust_root = dir.join("trust-root.pub");
    std::fs::write(&trust_root, key.public_key().to_pem())?;

    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .patch(PLUGIN_NAMESPACE, &PatchParams::apply(MANAGER), &Patch::Apply(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": PLUGIN_NAMESPACE } })))
        .await
        .context("creating the plugin namespace")?;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), PLUGIN_NAMESPACE);
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta { name: Some("plugin-hello".into()), ..Default::default() },
        binary_data: Some(BTreeMap::from([("hello.wasm".to_string(), ByteString(wasm))])),
        ..Default::default()
    };
    maps.patch("plugin-hello", &PatchParams::apply(MANAGER).force(), &Patch::Apply(&cm))
        .await
        .context("publishing the plugin ConfigMap")?;
    let plugins: Api<bosun_api::Plugin> = Api::all(client.clone());
    plugins
        .patch("hello", &PatchParams::apply(MANAGER).force(), &Patch::Apply(json!({
            "apiVersion": "bosun.dev/v1alpha1", "kind": "Plugin",
            "metadata": { "name": "hello", "annotations": { "bosun.dev/plugin-version": version } },
            "spec": {
                "source": { "configMap": { "namespace": PLUGIN_NAMESPACE, "name": "plugin-hello", "key": "hello.wasm" } },
                "sha256": digest.to_string(),
                "signatures": [{ "algorithm": "ed25519", "keyId": signature.key_id, "signature": signature.signature }],
                "grants": {
                    "filesystem": [{ "path": "/etc", "access": "ReadOnly" }],
                    "exec": [{ "command": "/usr/bin/uname", "args": [["-r"]] }],
                },
            },
        })))
        .await
        .context("applying the hello Plugin")?;
    Ok(trust_root)
}

/// Starts the controller and one agent per lab node.
fn start_operator(lab: &LabHandle, trust_root: &Path, dir: &Path) -> Result<Processes> {
    let mut procs = Processes { children: Vec::new(), logs: dir.to_path_buf() };
    procs.spawn(
        "controller",
        Command::new(binary("bosun-controller")?).env("KUBECONFIG", &lab.kubeconfig).env("BOSUN_LOG", "info,kube=warn"),
    )?;
    let agent = binary("bosun-agent")?;
    for node in &lab.nodes {
        procs.spawn(
            &format!("agent-{}", node.name),
            Command::new(&agent)
                .env("KUBECONFIG", &lab.kubeconfig)
                .env("BOSUN_LOG", "info,kube=warn")
                .arg("--node-name")
                .arg(&node.name)
                .arg("--host-root")
                .arg(&node.host_root)
                .arg("--trust-root")
                .arg(trust_root)
                .arg("--plugin-dir")
                .arg(dir.join(format!("plugins-{}", node.name))),
        )?;
    }
    Ok(procs)
}

/// Waits until the Operation leaves Pending/Running (or the deadline passes).
async fn wait_settled(client: &Client, name: &str, procs: &mut Processes) -> Result<Operation> {
    let ops: Api<Operation> = Api::all(client.clone());
    let started = std::time::Instant::now();
    loop {
        procs.check_alive()?;
        if let Some(op) = ops.get_opt(name).await? {
            let phase = op.status.as_ref().map(|s| s.phase).unwrap_or_default();
            if matches!(phase, OperationPhase::Succeeded | OperationPhase::Failed | OperationPhase::Blocked) {
                return Ok(op);
            }
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "Operation {name} did not settle within {DEADLINE:?}; logs in {}",
            procs.logs.display()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn tasks_of(client: &Client, op: &str) -> Result<BTreeMap<String, NodeTask>> {
    let api: Api<NodeTask> = Api::all(client.clone());
    let list = api.list(&ListParams::default().labels(&format!("bosun.dev/operation={op}"))).await?;
    Ok(list.items.into_iter().map(|t| (t.spec.node_name.clone(), t)).collect())
}

/// (first step started, last step finished) of a task, from its step status.
fn interval(task: &NodeTask) -> Result<(Timestamp, Timestamp)> {
    let status = task.status.as_ref().context("task has no status")?;
    let start = status.steps.iter().filter_map(|s| s.started_at.as_ref()).map(|t| t.0).min();
    let end = status.steps.iter().filter_map(|s| s.finished_at.as_ref()).map(|t| t.0).max();
    Ok((start.context("no step started")?, end.context("no step finished")?))
}

/// A custom Operation over 1 control-plane and 3 worker nodes with `maxUnavailable: 1`:
/// the control-plane node greets first; each worker is cordoned, greeted and uncordoned, one
/// at a time. Then an Operation whose step fails its preflight blocks, with the reason in
/// its status. (One test, because both need the same controller and agents and the
/// controller has no leader election yet: two controllers would both act.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_operation_runs_in_planned_order_and_a_failing_step_blocks() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let client = lab.client.clone();
    let cp: Vec<&str> = lab.nodes.iter().filter(|n| n.role == Role::ControlPlane).map(|n| n.name.as_str()).collect();
    let workers: Vec<&str> = lab.nodes.iter().filter(|n| n.role == Role::Worker).map(|n| n.name.as_str()).collect();
    ensure!(cp.len() == 1 && workers.len() == 3, "this test expects the default lab (1 control plane, 3 workers), found {cp:?} and {workers:?}");

    apply_crds(&client).await?;
    install_uname(&lab)?;
    let dir = target_dir().join("e2e-operator").join(unique("run"));
    std::fs::create_dir_all(&dir)?;
    let trust_root = publish_hello(&client, &dir).await?;
    let mut procs = start_operator(&lab, &trust_root, &dir)?;

    // --- 1. Succeeds, in the planned order.
    let name = unique("hello");
    let ops: Api<Operation> = Api::all(client.clone());
    let op_json = json!({
        "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation", "metadata": { "name": name },
        "spec": {
            "custom": { "groups": [
                { "name": "control-plane",
                  "nodeSelector": { "matchExpressions": [{ "key": "node-role.kubernetes.io/control-plane", "operator": "Exists" }] },
                  "steps": [{ "name": "greet", "plugin": "hello", "action": "greet", "params": { "name": "e2e" } }] },
                { "name": "workers",
                  "steps": [
                      { "name": "cordon", "runsOn": "controller", "action": "cordon" },
                      { "name": "greet", "plugin": "hello", "action": "greet", "params": { "name": "e2e" } },
                      { "name": "uncordon", "runsOn": "controller", "action": "uncordon" } ] } ] },
            "rollout": { "maxUnavailable": 1 },
        },
    });
    ops.patch(&name, &PatchParams::apply(MANAGER), &Patch::Apply(&op_json)).await.context("creating the Operation")?;
    let op = wait_settled(&client, &name, &mut procs).await?;
    let status = op.status.clone().unwrap_or_default();
    ensure!(
        status.phase == OperationPhase::Succeeded,
        "Operation {name} ended {:?}: {:?}; logs in {}",
        status.phase,
        status.message,
        dir.display()
    );
    assert_eq!(status.progress.as_deref(), Some("4/4"));
    assert!(status.conditions.iter().any(|c| c.type_ == "Complete" && c.status == "True"), "{:?}", status.conditions);

    // The frozen plan: the control-plane node alone, then the workers one at a time.
    let plan = status.plan.clone().context("no plan in status")?;
    let groups: Vec<(&str, Vec<&str>, u32)> =
        plan.groups.iter().map(|g| (g.name.as_str(), g.nodes.iter().map(String::as_str).collect(), g.max_parallel)).collect();
    let mut sorted_workers = workers.clone();
    sorted_workers.sort_unstable();
    assert_eq!(groups, vec![("control-plane", cp.clone(), 1), ("workers", sorted_workers.clone(), 1)]);

    let tasks = tasks_of(&client, &name).await?;
    assert_eq!(tasks.len(), 4, "one NodeTask per node: {:?}", tasks.keys());
    let kernel = String::from_utf8(Command::new("/usr/bin/uname").arg("-r").output()?.stdout)?.trim().to_string();
    for node in &lab.nodes {
        let task = &tasks[&node.name];
        let owner = task.owner_references().first().context("NodeTask has no owner")?;
        assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.controller), ("Operation", name.as_str(), Some(true)));
        let ts = task.status.clone().unwrap_or_default();
        assert_eq!(ts.phase, NodeTaskPhase::Succeeded, "{}: {:?}", node.name, ts.message);
        assert!(ts.steps.iter().all(|s| s.phase == StepPhase::Succeeded), "{}: {:?}", node.name, ts.steps);
        // The plugin really ran against this node's own host root: each lab node has a
        // different distribution in its os-release.
        let greet = ts.steps.iter().find(|s| s.name == "greet").context("no greet step status")?;
        assert_eq!(greet.outputs.get("os"), Some(&node.os), "{}", node.name);
        assert_eq!(greet.outputs.get("kernel"), Some(&kernel), "{}", node.name);
        assert_eq!(greet.preflight.len(), 1);
        assert_eq!(greet.preflight[0].status, CheckStatus::Pass);
        assert!(greet.log_tail.iter().any(|l| l.contains("greeting the node as e2e")), "{:?}", greet.log_tail);
        assert_eq!(greet.changed, Some(false), "hello only reads");
    }

    // Order from the recorded step times: the control-plane task finished before any
    // worker task started; worker tasks never overlapped (maxUnavailable 1) and ran in plan
    // order.
    let (_, cp_end) = interval(&tasks[cp[0]])?;
    let mut previous_end = cp_end;
    for w in &sorted_workers {
        let (start, end) = interval(&tasks[*w])?;
        assert!(start >= previous_end, "{w} started at {start} before the previous task finished at {previous_end}");
        assert!(end >= start);
        previous_end = end;
    }
    // The workers were cordoned during their turn and uncordoned after it.
    let nodes: Api<Node> = Api::all(client.clone());
    for w in &workers {
        let n = nodes.get(w).await?;
        assert_ne!(n.spec.and_then(|s| s.unschedulable), Some(true), "{w} was left cordoned");
    }

    // --- 2. A failing step blocks the task and the Operation, with the reason in status.
    let name = unique("hello-missing");
    let op_json = json!({
        "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation", "metadata": { "name": name },
        "spec": { "custom": { "groups": [
            { "name": "control-plane",
              "nodeSelector": { "matchExpressions": [{ "key": "node-role.kubernetes.io/control-plane", "operator": "Exists" }] },
              "steps": [{ "name": "greet", "plugin": "hello", "action": "greet", "params": { "file": "/etc/bosun-e2e-missing" } }] } ] } },
    });
    ops.patch(&name, &PatchParams::apply(MANAGER), &Patch::Apply(&op_json)).await.context("creating the failing Operation")?;
    let op = wait_settled(&client, &name, &mut procs).await?;
    let status = op.status.clone().unwrap_or_default();
    assert_eq!(status.phase, OperationPhase::Blocked, "{:?}", status.message);
    let message = status.message.clone().unwrap_or_default();
    assert!(message.contains("preflight failed") && message.contains("/etc/bosun-e2e-missing"), "{message}");
    let blocked = status.conditions.iter().find(|c| c.type_ == "Blocked").context("no Blocked condition")?;
    assert_eq!((blocked.status.as_str(), blocked.reason.as_str()), ("True", "PreflightFailed"));
    let tasks = tasks_of(&client, &name).await?;
    let ts = tasks[cp[0]].status.clone().unwrap_or_default();
    assert_eq!((ts.phase, ts.reason), (NodeTaskPhase::Blocked, Some(BlockReason::PreflightFailed)));
    let greet = &ts.steps[0];
    assert_eq!(greet.phase, StepPhase::Failed);
    assert_eq!(greet.preflight[0].status, CheckStatus::Fail);
    assert_eq!(greet.error.as_ref().map(|e| e.code.as_str()), Some("preflight-failed"));

    procs.check_alive()?;
    drop(procs);
    Ok(())
}
