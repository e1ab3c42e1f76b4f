//! The operator commands: `status`, `approve`, `retry`, `skip`, `pause`, `resume`, `logs`
//! on Operations and their NodeTasks, and `version`. (`plugin publish` is in `crate::plugin::publish`; it
//! connects through [`Connection`] too.)
//!
//! This module owns the cluster side of the CLI: connecting with the usual kubeconfig
//! rules, reading an Operation with its NodeTasks, checking the state before any change
//! ([`checks`]) and writing only the fields a person owns (`Operation.spec.paused`,
//! `NodeTask.spec.approve`, `NodeTask.spec.recovery`). Every write is a merge patch that
//! carries the `resourceVersion` the checks saw, so a change made in between makes the
//! API server refuse it (409) instead of acting on a stale view.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use bosun_api::node_task::NodeTask;
use bosun_api::operation::Operation;
use clap::{Args, Subcommand, ValueEnum};
use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, Config};
use serde_json::json;

use crate::Status;
use crate::terminal::{self, clean, errln, out, outln};

pub mod checks;
pub mod render;
pub mod version;

/// The field manager recorded for this CLI's writes.
pub const FIELD_MANAGER: &str = "kubectl-bosun";

/// How to reach the cluster: the usual kubeconfig rules.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// The kubeconfig file. Default: $KUBECONFIG (a `:`-separated list is merged), else
    /// ~/.kube/config, else the in-cluster service account.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context. Default: its current context.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

impl Connection {
    /// A client for the selected cluster.
    pub async fn client(&self) -> Result<Client> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            ..Default::default()
        };
        let config = match &self.kubeconfig {
            Some(path) => {
                let kubeconfig = Kubeconfig::read_from(path)
                    .with_context(|| format!("reading kubeconfig {}", path.display()))?;
                Config::from_custom_kubeconfig(kubeconfig, &options)
                    .await
                    .with_context(|| format!("using kubeconfig {}", path.display()))?
            }
            None if self.context.is_some() => Config::from_kubeconfig(&options)
                .await
                .context("loading the kubeconfig ($KUBECONFIG or ~/.kube/config)")?,
            None => Config::infer().await.context(
                "no cluster configuration found: set KUBECONFIG or pass --kubeconfig FILE",
            )?,
        };
        Client::try_from(config).context("building the Kubernetes client")
    }
}

/// The operator commands, siblings of `plugin` at the top level.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show an Operation at a glance: phase, progress, and groups → nodes → steps, with
    /// what blocks and the command that moves it on.
    Status(StatusArgs),
    /// Controlled mode: let NodeTasks start (sets spec.approve on each).
    // clap would print the required group first (`<NODE|--all> <OPERATION>`); the
    // Operation comes first, as the command takes it.
    #[command(
        override_usage = "kubectl-bosun approve [OPTIONS] <OPERATION> <NODE>...\n       kubectl-bosun approve [OPTIONS] <OPERATION> --all"
    )]
    Approve(ApproveArgs),
    /// Run the failed step of a Blocked node again, after fixing its cause (recovery: Retry).
    Retry(NodeArgs),
    /// Leave a Blocked node as it is and let the Operation move on (recovery: Skip).
    Skip(NodeArgs),
    /// Pause an Operation: running steps finish, nothing new starts (spec.paused: true).
    Pause(OperationArgs),
    /// Resume a paused Operation (spec.paused: false).
    Resume(OperationArgs),
    /// Print the log tail of a node's steps, as its agent reported them in the NodeTask.
    Logs(LogsArgs),
    /// Print this client's version and the running controllers' (read from their Leases).
    Version(version::VersionArgs),
}

/// Machine-readable output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Json,
    Yaml,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The Operation's name. Without one, or `cluster`: the ClusterLifecycle (desired and
    /// observed state, and the Operations it generated).
    pub operation: Option<String>,
    /// Re-render whenever the Operation or one of its NodeTasks changes; ends when the
    /// Operation has finished (Succeeded or Failed, exit code 0) or is Blocked with no
    /// recovery requested (exit code 3, after the reason and the commands that resolve it).
    #[arg(short, long)]
    pub watch: bool,
    /// Print the Operation and its NodeTasks as JSON or YAML instead of the tree.
    #[arg(short, long, value_enum, value_name = "FORMAT")]
    pub output: Option<Format>,
    #[command(flatten)]
    pub conn: Connection,
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("which").required(true).args(["nodes", "all"]))]
pub struct ApproveArgs {
    /// The Operation's name.
    pub operation: String,
    /// The nodes whose NodeTasks may start.
    #[arg(value_name = "NODE")]
    pub nodes: Vec<String>,
    /// Approve every NodeTask that has not started and is not approved yet.
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub conn: Connection,
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    /// The Operation's name.
    pub operation: String,
    /// The node whose NodeTask is Blocked.
    pub node: String,
    #[command(flatten)]
    pub conn: Connection,
}

#[derive(Debug, Args)]
pub struct OperationArgs {
    /// The Operation's name.
    pub operation: String,
    #[command(flatten)]
    pub conn: Connection,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The Operation's name.
    pub operation: String,
    /// The node.
    pub node: String,
    /// Only this step.
    #[arg(long, value_name = "STEP")]
    pub step: Option<String>,
    #[command(flatten)]
    pub conn: Connection,
}

/// Runs an operator command on a fresh single-threaded runtime.
pub fn execute(cmd: Command) -> Result<Status> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        match cmd {
            Command::Status(a) => status(a).await,
            Command::Approve(a) => approve(a).await,
            Command::Retry(a) => recover(a, bosun_api::Recovery::Retry).await,
            Command::Skip(a) => recover(a, bosun_api::Recovery::Skip).await,
            Command::Pause(a) => set_paused(a, true).await,
            Command::Resume(a) => set_paused(a, false).await,
            Command::Logs(a) => logs(a).await,
            Command::Version(a) => version::version(a).await,
        }
    })
}

/// The Operation, or an error that says how to find the right name.
async fn get_operation(client: &Client, name: &str) -> Result<Operation> {
    let api: Api<Operation> = Api::all(client.clone());
    match api.get_opt(name).await {
        Ok(Some(op)) => Ok(op),
        Ok(None) => bail!(
            "Operation {name} not found; `kubectl get operations` lists the Operations there are"
        ),
        Err(kube::Error::Api(e)) if e.code == 404 => bail!(
            "the API server does not know Operations (404): install Bosun's CRDs first: kubectl apply -f deploy/crds/"
        ),
        Err(e) => Err(e).with_context(|| format!("reading Operation {name}")),
    }
}

/// The Operation's NodeTasks (by the selectable field `spec.operation`, so long names
/// that do not fit a label value work too), sorted by node name.
async fn tasks_of(client: &Client, op: &str) -> Result<Vec<NodeTask>> {
    let api: Api<NodeTask> = Api::all(client.clone());
    let mut tasks = api
        .list(&ListParams::default().fields(&format!("spec.operation={op}")))
        .await
        .with_context(|| format!("listing the NodeTasks of Operation {op}"))?
        .items;
    tasks.sort_by(|a, b| a.spec.node_name.cmp(&b.spec.node_name));
    Ok(tasks)
}

async fn snapshot(client: &Client, name: &str) -> Result<(Operation, Vec<NodeTask>)> {
    let op = get_operation(client, name).await?;
    let tasks = tasks_of(client, name).await?;
    Ok((op, tasks))
}

fn style() -> render::Style {
    render::Style::detect(
        terminal::stdout_is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

fn machine_output(format: Format, op: &Operation, tasks: &[NodeTask]) -> Result<String> {
    let doc = json!({ "operation": op, "nodeTasks": tasks });
    match format {
        Format::Json => terminal::json(&doc),
        Format::Yaml => terminal::yaml(&doc),
    }
}

// The renderings for people. Plugins write the messages, logs, outputs and checks shown
// (through the agent), so every string of the resources is escaped first; each rendering
// goes through here, `status --watch`'s final summary too.

/// The status tree of an Operation and its NodeTasks.
fn human_status(
    op: &Operation,
    tasks: &[NodeTask],
    now: Timestamp,
    style: render::Style,
) -> Result<String> {
    let op = terminal::cleaned(op)?;
    let tasks = tasks.iter().map(for_people).collect::<Result<Vec<_>>>()?;
    Ok(render::status(&op, &tasks, now, style))
}

/// What `status --watch` ends with when the Operation is Blocked.
fn human_blocked_summary(op: &Operation, tasks: &[NodeTask]) -> Result<Option<String>> {
    let op = terminal::cleaned(op)?;
    let tasks = tasks.iter().map(for_people).collect::<Result<Vec<_>>>()?;
    Ok(render::blocked_summary(&op, &tasks))
}

/// The log tails of a NodeTask's steps.
fn human_logs(task: &NodeTask, step: Option<&str>, now: Timestamp) -> Result<String> {
    Ok(render::logs(&for_people(task)?, step, now))
}

/// The ClusterLifecycle and the Operations it generated.
fn human_lifecycle(
    cl: &bosun_api::ClusterLifecycle,
    generated: &[Operation],
    reports: &[bosun_api::NodeReport],
    now: Timestamp,
    style: render::Style,
) -> Result<String> {
    let cl = terminal::cleaned(cl)?;
    let generated = generated
        .iter()
        .map(terminal::cleaned)
        .collect::<Result<Vec<_>>>()?;
    let reports = reports
        .iter()
        .map(terminal::cleaned)
        .collect::<Result<Vec<_>>>()?;
    Ok(render::lifecycle(&cl, &generated, &reports, now, style))
}

async fn status(args: StatusArgs) -> Result<Status> {
    let client = args.conn.client().await?;
    let style = style();
    let name = match args.operation.as_deref() {
        None | Some(bosun_api::lifecycle::NAME) => {
            return lifecycle_status(&client, args.output, args.watch, style).await;
        }
        Some(name) => name,
    };
    let show = |op: &Operation, tasks: &[NodeTask]| -> Result<String> {
        match args.output {
            Some(f) => machine_output(f, op, tasks),
            None => human_status(op, tasks, Timestamp::now(), style),
        }
    };
    if !args.watch {
        let (op, tasks) = snapshot(&client, name).await?;
        terminal::out_styled(&show(&op, &tasks)?, style.color);
        return Ok(Status::Success);
    }

    // Watch: any event on the Operation or its tasks triggers a fresh read and a
    // re-render. On a terminal the screen is redrawn (and refreshed each second so running
    // times move); elsewhere each changed rendering is printed after a blank line.
    let redraw = terminal::stdout_is_terminal() && args.output.is_none();
    let ops: Api<Operation> = Api::all(client.clone());
    let tasks_api: Api<NodeTask> = Api::all(client.clone());
    let op_events = watcher(
        ops,
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .default_backoff()
    .map(|e| e.map(|_| ()));
    let task_events = watcher(
        tasks_api,
        watcher::Config::default().fields(&format!("spec.operation={name}")),
    )
    .default_backoff()
    .map(|e| e.map(|_| ()));
    let mut events = futures::stream::select(op_events, task_events).boxed();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last = String::new();
    loop {
        let (op, tasks) = snapshot(&client, name).await?;
        let text = show(&op, &tasks)?;
        if text != last {
            if redraw {
                terminal::clear_screen();
                terminal::out_styled(&format!("{text}\n{}", style_hint(style)), style.color);
            } else {
                if !last.is_empty() {
                    outln!();
                }
                terminal::out_styled(&text, style.color);
            }
            terminal::flush();
            last = text;
        }
        if op.status.as_ref().is_some_and(|s| s.phase.is_finished()) {
            return Ok(Status::Success);
        }
        // Blocked stays Blocked until a person acts: say why and how, and stop watching.
        if args.output.is_none()
            && let Some(summary) = human_blocked_summary(&op, &tasks)?
        {
            out!("\n{summary}");
            return Ok(Status::Blocked);
        }
        tokio::select! {
            event = events.next() => match event {
                None => bail!("the watch on Operation {name} ended unexpectedly"),
                // The watcher retries with backoff; a failed round is reported, not fatal.
                Some(Err(e)) => errln!(
                    "warning: watching Operation {name}: {}",
                    clean(&e.to_string())
                ),
                Some(Ok(())) => {}
            },
            _ = tick.tick(), if redraw => {}
        }
        // Coalesce a burst of events (one step's writes come in several) into one render.
        tokio::time::sleep(Duration::from_millis(150)).await;
        while let Some(Some(_)) = events.next().now_or_never() {}
    }
}

/// `status` without an Operation: the ClusterLifecycle and the Operations it generated.
async fn lifecycle_status(
    client: &Client,
    output: Option<Format>,
    watch: bool,
    style: render::Style,
) -> Result<Status> {
    if watch {
        bail!(
            "--watch follows one Operation: name it (the ClusterLifecycle's current one is in its status.currentOperation)"
        );
    }
    let api: Api<bosun_api::ClusterLifecycle> = Api::all(client.clone());
    let Some(cl) = api
        .get_opt(bosun_api::lifecycle::NAME)
        .await
        .context("reading ClusterLifecycle cluster")?
    else {
        bail!(
            "there is no ClusterLifecycle in this cluster (the controller creates one on start from kube-system/kubeadm-config; see docs/lifecycle.md); to show an Operation, name it: kubectl bosun status NAME"
        );
    };
    let ops: Api<Operation> = Api::all(client.clone());
    let generated = ops
        .list(&kube::api::ListParams::default().labels(bosun_api::labels::LIFECYCLE))
        .await
        .context("listing the generated Operations")?
        .items;
    let doc = || serde_json::json!({ "clusterLifecycle": cl, "operations": generated });
    let text = match output {
        Some(Format::Json) => terminal::json(&doc())?,
        Some(Format::Yaml) => terminal::yaml(&doc())?,
        None => {
            // Only for the reasons of the nodes that need a reboot: their names and count
            // are in the ClusterLifecycle's status, so a user who may not list NodeReports
            // still sees them.
            let reports = if cl.status.as_ref().is_some_and(|s| s.reboots.required > 0) {
                let api: Api<bosun_api::NodeReport> = Api::all(client.clone());
                api.list(&kube::api::ListParams::default())
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default()
            } else {
                Vec::new()
            };
            human_lifecycle(&cl, &generated, &reports, Timestamp::now(), style)?
        }
    };
    terminal::out_styled(&text, style.color);
    Ok(Status::Success)
}

/// A NodeTask for the human renderings: every string escaped ([`terminal::cleaned`]), and
/// the steps' recorded start and end times kept as they are. (The escaping goes through
/// serde, where a `Time` keeps whole seconds only: a 30 ms step would read `0ms`, a 1.7 s
/// one `1.0s`.)
fn for_people(task: &NodeTask) -> Result<NodeTask> {
    let mut clean = terminal::cleaned(task)?;
    if let (Some(to), Some(from)) = (clean.status.as_mut(), task.status.as_ref()) {
        for (step, recorded) in to.steps.iter_mut().zip(&from.steps) {
            step.started_at.clone_from(&recorded.started_at);
            step.finished_at.clone_from(&recorded.finished_at);
        }
    }
    Ok(clean)
}

fn style_hint(style: render::Style) -> String {
    let text = "watching; Ctrl-C to stop";
    if style.color {
        format!("\x1b[2m{text}\x1b[0m\n")
    } else {
        format!("{text}\n")
    }
}

/// A merge patch of `spec` that only applies to the `resourceVersion` the checks saw.
fn guarded_patch(
    resource_version: Option<&String>,
    spec: serde_json::Value,
) -> Patch<serde_json::Value> {
    Patch::Merge(json!({ "metadata": { "resourceVersion": resource_version }, "spec": spec }))
}

/// Turns a 409 from a guarded patch into advice to look again.
fn conflict_advice(e: kube::Error, what: &str, op: &str) -> anyhow::Error {
    match e {
        kube::Error::Api(ae) if ae.code == 409 => anyhow::anyhow!(
            "{what} changed while this command ran, so nothing was written; look again with `kubectl bosun status {op}` and repeat the command if it still applies"
        ),
        other => anyhow::Error::new(other).context(format!("writing {what}")),
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

async fn approve(args: ApproveArgs) -> Result<Status> {
    let client = args.conn.client().await?;
    let (op, tasks) = snapshot(&client, &args.operation).await?;
    let chosen: Vec<&NodeTask> = if args.all {
        checks::approve_all(&op, &tasks)?
    } else {
        let mut chosen = Vec::new();
        // Check every node before writing anything: all or nothing.
        for node in &args.nodes {
            let task = checks::task_of(&op, &tasks, node)?;
            checks::approve(&op, task)?;
            chosen.push(task);
        }
        chosen
    };
    let api: Api<NodeTask> = Api::all(client.clone());
    for task in chosen {
        let name = task.metadata.name.clone().unwrap_or_default();
        api.patch(
            &name,
            &patch_params(),
            &guarded_patch(
                task.metadata.resource_version.as_ref(),
                json!({ "approve": true }),
            ),
        )
        .await
        .map_err(|e| conflict_advice(e, &format!("NodeTask {name}"), &args.operation))?;
        outln!(
            "approved {} (NodeTask {})",
            clean(&task.spec.node_name),
            clean(&name)
        );
    }
    Ok(Status::Success)
}

async fn recover(args: NodeArgs, recovery: bosun_api::Recovery) -> Result<Status> {
    let client = args.conn.client().await?;
    let (op, tasks) = snapshot(&client, &args.operation).await?;
    let task = checks::task_of(&op, &tasks, &args.node)?;
    let verb = match recovery {
        bosun_api::Recovery::Retry => "retry",
        bosun_api::Recovery::Skip => "skip",
    };
    checks::recovery(&op, task, verb)?;
    let name = task.metadata.name.clone().unwrap_or_default();
    let api: Api<NodeTask> = Api::all(client.clone());
    api.patch(
        &name,
        &patch_params(),
        &guarded_patch(
            task.metadata.resource_version.as_ref(),
            json!({ "recovery": recovery }),
        ),
    )
    .await
    .map_err(|e| conflict_advice(e, &format!("NodeTask {name}"), &args.operation))?;
    let step = task
        .status
        .as_ref()
        .and_then(|s| s.current_step.as_deref())
        .map_or_else(|| "its failed step".into(), |s| clean(s).into_owned());
    let name = clean(&name);
    match recovery {
        bosun_api::Recovery::Retry => outln!(
            "recovery: Retry set on NodeTask {name}: the controller runs step {step} on {} again",
            args.node
        ),
        bosun_api::Recovery::Skip => outln!(
            "recovery: Skip set on NodeTask {name}: {} is left as it is (from step {step} on) and the Operation moves on",
            args.node
        ),
    }
    outln!(
        "follow it with: kubectl bosun status {} --watch",
        args.operation
    );
    Ok(Status::Success)
}

async fn set_paused(args: OperationArgs, paused: bool) -> Result<Status> {
    let client = args.conn.client().await?;
    let op = get_operation(&client, &args.operation).await?;
    if paused {
        checks::pause(&op)?;
    } else {
        checks::resume(&op)?;
    }
    let api: Api<Operation> = Api::all(client.clone());
    api.patch(
        &args.operation,
        &patch_params(),
        &guarded_patch(
            op.metadata.resource_version.as_ref(),
            json!({ "paused": paused }),
        ),
    )
    .await
    .map_err(|e| conflict_advice(e, &format!("Operation {}", args.operation), &args.operation))?;
    if paused {
        outln!(
            "paused {}: running steps finish, nothing new starts; resume with `kubectl bosun resume {}`",
            args.operation,
            args.operation
        );
    } else {
        outln!("resumed {}", args.operation);
    }
    Ok(Status::Success)
}

async fn logs(args: LogsArgs) -> Result<Status> {
    let client = args.conn.client().await?;
    let (op, tasks) = snapshot(&client, &args.operation).await?;
    let task = checks::task_of(&op, &tasks, &args.node)?;
    if let Some(step) = &args.step
        && !task.spec.steps.iter().any(|s| &s.name == step)
    {
        let names: Vec<&str> = task.spec.steps.iter().map(|s| s.name.as_str()).collect();
        bail!(
            "NodeTask {} has no step {step}; its steps are: {}",
            task.metadata.name.as_deref().unwrap_or("?"),
            names.join(", ")
        );
    }
    // The log lines are the plugin's own.
    out!(
        "{}",
        human_logs(task, args.step.as_deref(), Timestamp::now())?
    );
    Ok(Status::Success)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bosun_api::node_task::{NodeTaskSpec, NodeTaskStatus, StepPhase, StepStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    /// What `status` and `logs` render keeps the steps' sub-second times (the agent records
    /// microseconds), and still escapes what plugins wrote.
    #[test]
    fn tasks_for_people_keep_sub_second_step_times() {
        let spec: NodeTaskSpec = serde_json::from_value(json!({
            "operation": "op", "nodeName": "n1", "group": "g",
            "steps": [{"name": "greet", "plugin": "hello", "action": "greet"}]
        }))
        .unwrap();
        let mut task = NodeTask::new("op-n1", spec);
        let time = |s: &str| Some(Time(s.parse().unwrap()));
        task.status = Some(NodeTaskStatus {
            steps: vec![StepStatus {
                name: "greet".into(),
                phase: StepPhase::Succeeded,
                started_at: time("2026-11-30T03:00:02.123456Z"),
                finished_at: time("2026-11-30T03:00:03.854321Z"),
                message: Some("hi\x1b[2J".into()),
                ..Default::default()
            }],
            ..Default::default()
        });
        let shown = for_people(&task).unwrap();
        let step = &shown.status.as_ref().unwrap().steps[0];
        assert_eq!(step.started_at, time("2026-11-30T03:00:02.123456Z"));
        assert_eq!(step.finished_at, time("2026-11-30T03:00:03.854321Z"));
        assert_eq!(step.message.as_deref(), Some("hi\\u{1b}[2J"));
    }

    /// Control characters of every kind, a carriage return and a newline that start forged
    /// lines, bidirectional overrides: what a plugin can put in any text the agent writes.
    const H: &str = "<\x1b]0;pwned\x07\x1b[2J\x1b[1;1H\rFORGED\x00\x01\x1f\x7f\u{85}\u{9b}31m\u{202e}\u{2066}\nFORGED verified: signed by admin>";

    /// Everything `status` and `logs` read from the cluster.
    #[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
    struct Cluster {
        op: Operation,
        tasks: Vec<NodeTask>,
        cl: bosun_api::ClusterLifecycle,
        #[serde(default)]
        generated: Vec<Operation>,
        #[serde(default)]
        reports: Vec<bosun_api::NodeReport>,
    }

    /// An Operation Blocked on one node, with a task of each kind the renderings treat
    /// apart, every text field filled in, and a ClusterLifecycle that generated it.
    fn cluster() -> Cluster {
        let step = |name: &str, controller: bool| {
            if controller {
                json!({"name": name, "runsOn": "controller", "action": name})
            } else {
                json!({"name": name, "plugin": "hello", "action": "greet", "params": {"name": "x"}})
            }
        };
        let steps = json!([
            step("cordon", true),
            step("greet", false),
            step("uncordon", true)
        ]);
        let facts = json!({
            "collectedAt": "2026-11-30T03:00:01Z", "kubeletVersion": "v1.33.5",
            "kubeadmVersion": "v1.33.5", "kubectlVersion": "v1.33.5",
            "packages": [{"name": "kubeadm", "version": "1.33.5-1.1"}], "os": "Debian",
            "arch": "amd64", "kernel": "6.12.0",
            "certificates": [{"name": "apiserver", "notAfter": "2027-11-30T03:00:00Z"}],
            "commandConfinement": {"landlockAbi": 4, "seccomp": true, "missing": ["x"]},
        });
        let condition = |type_: &str, reason: &str| {
            json!({"type": type_, "status": "True", "reason": reason, "message": "why",
                   "lastTransitionTime": "2026-11-30T03:00:02Z"})
        };
        let task = |node: &str, status: serde_json::Value| {
            json!({
                "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeTask",
                "metadata": {"name": format!("op1-{node}")},
                "spec": {"operation": "op1", "nodeName": node, "group": "workers", "steps": steps},
                "status": status,
            })
        };
        let time = |s: &str| json!(s);
        let value = json!({
            "op": {
                "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation",
                "metadata": {"name": "op1", "creationTimestamp": "2026-11-30T03:00:00Z"},
                "spec": {"custom": {"groups": [{"name": "workers", "steps": steps}]}},
                "status": {
                    "phase": "Blocked", "progress": "1/4",
                    "message": "n2: preflight failed: not found",
                    "conditions": [condition("Blocked", "PreflightFailed")],
                    "plan": {"groups": [{"name": "workers", "nodes": ["n1", "n2", "n3", "n4", "n5"], "maxParallel": 2, "controlPlaneNodes": []}]},
                },
            },
            "tasks": [
                task("n1", json!({
                    "phase": "Succeeded", "attempts": 1, "message": "done",
                    "nodeFacts": {"before": facts, "after": facts},
                    "steps": [
                        {"name": "cordon", "phase": "Succeeded", "attempts": 1, "message": "cordoned",
                         "startedAt": time("2026-11-30T03:00:02Z"), "finishedAt": time("2026-11-30T03:00:03Z")},
                        {"name": "greet", "phase": "Succeeded", "attempts": 1, "changed": true,
                         "message": "hello", "logTail": ["line"],
                         "outputs": {"kernel": "6.12", "apiserver.before": "a", "apiserver.after": "b"},
                         "preflight": [{"name": "file-readable", "status": "Warn", "message": "slow"}],
                         "policy": {"allowed": true, "messages": [], "policySetDigest": "sha256:00"},
                         "startedAt": time("2026-11-30T03:00:03Z"), "finishedAt": time("2026-11-30T03:00:04Z")},
                    ],
                })),
                task("n2", json!({
                    "phase": "Blocked", "attempts": 2, "reason": "PreflightFailed",
                    "message": "the agent restarted during step greet",
                    "currentStep": "greet",
                    "conditions": [condition("Blocked", "PreflightFailed")],
                    "steps": [
                        {"name": "cordon", "phase": "Succeeded", "attempts": 1,
                         "startedAt": time("2026-11-30T03:00:02Z"), "finishedAt": time("2026-11-30T03:00:03Z")},
                        {"name": "greet", "phase": "Failed", "attempts": 2, "message": "it failed",
                         "logTail": ["checking", "still checking"],
                         "preflight": [{"name": "file-readable", "status": "Fail", "message": "not found"}],
                         "error": {"code": "preflight-failed", "message": "not found", "retryable": true},
                         "startedAt": time("2026-11-30T03:00:03Z"), "finishedAt": time("2026-11-30T03:00:04Z")},
                    ],
                })),
                task("n3", json!({
                    "phase": "Pending", "message": "waiting: node n3 is held by Operation other",
                    "conditions": [condition("NodeHeld", "HeldByOtherOperation")],
                })),
                task("n4", json!({"phase": "Skipped", "message": "skipped by a person"})),
                task("n5", json!({
                    "phase": "Running", "attempts": 1, "currentStep": "cordon",
                    "steps": [{"name": "cordon", "phase": "Running", "attempts": 1,
                               "startedAt": time("2026-11-30T03:00:02Z")}],
                })),
            ],
            "cl": {
                "apiVersion": "bosun.dev/v1alpha1", "kind": "ClusterLifecycle",
                "metadata": {"name": "cluster"},
                "spec": {"kubernetesVersion": "v1.34.4", "certificates": {"autoRenew": true}},
                "status": {
                    "conditions": [condition("InSync", "Upgrading"), condition("Progressing", "Waiting")],
                    "waiting": "op1", "summary": "upgrading",
                    "versions": {"nodesAtDesired": 1, "nodes": 5, "lowest": "v1.33.5", "highest": "v1.34.4"},
                    "certificates": {"earliestExpiry": "2027-11-30T03:00:00Z", "earliest": "apiserver",
                                     "nextRenewal": "2027-10-30T03:00:00Z", "nodesReported": 1, "handledRotation": 0},
                    "reboots": {"required": 1, "nodes": ["n2"], "nodesReported": 2},
                    "currentOperation": "op1",
                    "history": [{"name": "op1", "kind": "upgrade", "reason": "desired v1.34.4",
                                 "createdAt": "2026-11-30T03:00:00Z"}],
                },
            },
            "reports": [{
                "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeReport",
                "metadata": {"name": "n2"},
                "spec": {"nodeName": "n2", "facts": {
                    "collectedAt": "2026-11-30T03:00:01Z",
                    "reboot": {"required": true, "reasons": ["/run/reboot-required is present (asked for by libc6)"],
                               "packages": ["libc6"]},
                }},
            }],
        });
        let mut c: Cluster = serde_json::from_value(value).unwrap();
        c.generated = vec![c.op.clone()];
        c
    }

    /// `text` without the SGR sequences (`ESC [ digits ; m`) the CLI colours with.
    fn without_colours(text: &str) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(i) = rest.find("\x1b[") {
            out.push_str(&rest[..i]);
            let params = &rest[i + 2..];
            match params.find(|c: char| !(c.is_ascii_digit() || c == ';')) {
                Some(j) if params[j..].starts_with('m') => rest = &params[j + 1..],
                _ => {
                    out.push('\x1b');
                    rest = &rest[i + 1..];
                }
            }
        }
        out + rest
    }

    /// What is wrong with a rendering: raw controls (but newlines and tabs; with colour,
    /// but its SGR sequences), bidirectional controls, lines that start forged.
    fn leaks(what: &str, text: &str) -> Vec<String> {
        let unsafe_char = |c: char| {
            (c.is_control() && c != '\n' && c != '\t')
                || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        };
        let mut found = Vec::new();
        for line in without_colours(text).split('\n') {
            if line.chars().any(unsafe_char) {
                found.push(format!("{what}: raw control character in {line:?}"));
            }
            if line
                .trim_start_matches(['│', '├', '└', '─', ' '])
                .starts_with("FORGED")
            {
                found.push(format!("{what}: forged line {line:?}"));
            }
        }
        found
    }

    /// Every rendering `status`, `status --watch`, `status` without an Operation and `logs`
    /// print for people, plain and coloured, and their machine output.
    fn renderings(c: &Cluster) -> Vec<(String, String)> {
        let now: Timestamp = "2026-11-30T03:01:12Z".parse().unwrap();
        let mut out = Vec::new();
        for style in [render::Style::PLAIN, render::Style { color: true }] {
            let tag = if style.color { " (colour)" } else { "" };
            out.push((
                format!("status{tag}"),
                human_status(&c.op, &c.tasks, now, style).unwrap(),
            ));
            out.push((
                format!("status cluster{tag}"),
                human_lifecycle(&c.cl, &c.generated, &c.reports, now, style).unwrap(),
            ));
        }
        out.push((
            "status --watch, blocked".into(),
            human_blocked_summary(&c.op, &c.tasks)
                .unwrap()
                .unwrap_or_default(),
        ));
        for t in &c.tasks {
            out.push((
                format!("logs {}", t.spec.node_name),
                human_logs(t, None, now).unwrap(),
            ));
        }
        for format in [Format::Json, Format::Yaml] {
            out.push((
                format!("status -o {format:?}"),
                machine_output(format, &c.op, &c.tasks).unwrap(),
            ));
        }
        out
    }

    /// Where one string of the resources is: a value, or a key of an object.
    enum Leaf {
        Value(String),
        Key(String, String),
    }

    fn leaves(v: &serde_json::Value, at: &str, out: &mut Vec<Leaf>) {
        let token = |k: &str| k.replace('~', "~0").replace('/', "~1");
        match v {
            serde_json::Value::String(_) => out.push(Leaf::Value(at.to_owned())),
            serde_json::Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    leaves(item, &format!("{at}/{i}"), out);
                }
            }
            serde_json::Value::Object(map) => {
                for (k, item) in map {
                    out.push(Leaf::Key(at.to_owned(), k.clone()));
                    leaves(item, &format!("{at}/{}", token(k)), out);
                }
            }
            _ => {}
        }
    }

    /// `cluster()` with `H` added to the string at `leaf`; `None` when the result is not
    /// a valid resource any more (a time, an enum, a field name).
    fn hostile_at(base: &serde_json::Value, leaf: &Leaf) -> Option<Cluster> {
        let mut doc = base.clone();
        match leaf {
            Leaf::Value(at) => {
                let s = doc.pointer_mut(at)?;
                *s = format!("{}{H}", s.as_str()?).into();
            }
            Leaf::Key(at, key) => {
                let map = doc.pointer_mut(at)?.as_object_mut()?;
                let v = map.remove(key)?;
                map.insert(format!("{key}{H}"), v);
            }
        }
        serde_json::from_value(doc).ok()
    }

    /// `status` and `logs` need a cluster, so their renderings are driven here: the plugin-
    /// and agent-written fields in the table must each be shown, escaped, by some
    /// rendering; then every string of the resources (each value and each key, one at a
    /// time) is made hostile and no rendering may let it through raw. Machine output
    /// escapes in its own syntax and parses back to the same resources.
    #[test]
    fn every_human_rendering_escapes_every_string_of_the_resources() {
        let clean_cluster = cluster();
        let base = serde_json::to_value(&clean_cluster).unwrap();
        for (what, text) in renderings(&clean_cluster) {
            assert!(leaks(&what, &text).is_empty(), "{what}:\n{text}");
        }

        #[rustfmt::skip]
        let shown: &[(&str, &str)] = &[
            ("Operation message", "/op/status/message"),
            ("Operation Blocked reason", "/op/status/conditions/0/reason"),
            ("task message (blocked)", "/tasks/1/status/message"),
            ("task message (node held)", "/tasks/2/status/message"),
            ("task message (skipped)", "/tasks/3/status/message"),
            ("step outcome message", "/tasks/0/status/steps/1/message"),
            ("controller step message", "/tasks/0/status/steps/0/message"),
            ("step output value", "/tasks/0/status/steps/1/outputs/kernel"),
            ("step output before", "/tasks/0/status/steps/1/outputs/apiserver.before"),
            ("step log line", "/tasks/1/status/steps/1/logTail/1"),
            ("preflight check name", "/tasks/1/status/steps/1/preflight/0/name"),
            ("preflight check message", "/tasks/1/status/steps/1/preflight/0/message"),
            ("step error code", "/tasks/1/status/steps/1/error/code"),
            ("step error message", "/tasks/1/status/steps/1/error/message"),
            ("kubelet version fact", "/tasks/0/status/nodeFacts/after/kubeletVersion"),
            ("certificate name fact", "/tasks/0/status/nodeFacts/after/certificates/0/name"),
            ("node name", "/tasks/1/spec/nodeName"),
            ("step name", "/tasks/1/spec/steps/1/name"),
            ("plan group", "/op/status/plan/groups/0/name"),
            ("lifecycle summary", "/cl/status/summary"),
            ("lifecycle waiting", "/cl/status/waiting"),
            ("lifecycle condition message", "/cl/status/conditions/1/message"),
            ("lifecycle lowest version", "/cl/status/versions/lowest"),
            ("lifecycle earliest certificate", "/cl/status/certificates/earliest"),
            ("lifecycle history reason", "/cl/status/history/0/reason"),
            ("lifecycle history kind", "/cl/status/history/0/kind"),
        ];
        let mut failures = Vec::new();
        for (field, at) in shown {
            let Some(c) = hostile_at(&base, &Leaf::Value((*at).to_owned())) else {
                failures.push(format!("{field}: {at} is not a string of the resources"));
                continue;
            };
            let all = renderings(&c);
            for (what, text) in &all {
                failures.extend(leaks(&format!("{field} in {what}"), text));
            }
            if !all
                .iter()
                .any(|(what, text)| !what.contains("-o") && text.contains("<\\u{1b}]0;pwned\\u{7}"))
            {
                failures.push(format!("{field}: no rendering shows it"));
            }
        }

        let mut all = Vec::new();
        leaves(&base, "", &mut all);
        let mut tried = 0;
        for leaf in &all {
            let Some(c) = hostile_at(&base, leaf) else {
                continue;
            };
            tried += 1;
            let at = match leaf {
                Leaf::Value(at) => at.clone(),
                Leaf::Key(at, key) => format!("{at} key {key}"),
            };
            for (what, text) in renderings(&c) {
                failures.extend(leaks(&format!("{at} in {what}"), &text));
            }
            // Machine output: the same resources, parsed back (YAML reads JSON too).
            let want =
                serde_json::to_value(json!({"operation": c.op, "nodeTasks": c.tasks})).unwrap();
            for format in [Format::Json, Format::Yaml] {
                let text = machine_output(format, &c.op, &c.tasks).unwrap();
                match serde_yaml::from_str::<serde_json::Value>(&text) {
                    Ok(back) if back == want => {}
                    Ok(_) => failures.push(format!("{at}: -o {format:?} parses to other values")),
                    Err(e) => failures.push(format!("{at}: -o {format:?} does not parse: {e}")),
                }
            }
        }
        assert!(tried > 100, "only {tried} strings could be made hostile");
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }
}
