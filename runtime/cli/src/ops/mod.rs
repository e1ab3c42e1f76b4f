//! The operator commands: `status`, `approve`, `retry`, `skip`, `pause`, `resume`, `logs`
//! on Operations and their NodeTasks. (`plugin publish` is in `crate::plugin::publish`; it
//! connects through [`Connection`] too.)
//!
//! This module owns the cluster side of the CLI: connecting with the usual kubeconfig
//! rules, reading an Operation with its NodeTasks, checking the state before any change
//! ([`checks`]) and writing only the fields a person owns (`Operation.spec.paused`,
//! `NodeTask.spec.approve`, `NodeTask.spec.recovery`). Every write is a merge patch that
//! carries the `resourceVersion` the checks saw, so a change made in between makes the
//! API server refuse it (409) instead of acting on a stale view.

use std::io::IsTerminal as _;
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
use crate::terminal;

pub mod checks;
pub mod render;

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
        std::io::stdout().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

fn machine_output(format: Format, op: &Operation, tasks: &[NodeTask]) -> Result<String> {
    let doc = json!({ "operation": op, "nodeTasks": tasks });
    Ok(match format {
        Format::Json => serde_json::to_string_pretty(&doc)? + "\n",
        Format::Yaml => serde_yaml::to_string(&doc)?,
    })
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
            None => {
                // Plugins write the messages, logs and outputs shown here.
                let op = terminal::cleaned(op)?;
                let tasks = tasks.iter().map(for_people).collect::<Result<Vec<_>>>()?;
                Ok(render::status(&op, &tasks, Timestamp::now(), style))
            }
        }
    };
    if !args.watch {
        let (op, tasks) = snapshot(&client, name).await?;
        print!("{}", show(&op, &tasks)?);
        return Ok(Status::Success);
    }

    // Watch: any event on the Operation or its tasks triggers a fresh read and a
    // re-render. On a terminal the screen is redrawn (and refreshed each second so running
    // times move); elsewhere each changed rendering is printed after a blank line.
    let terminal = std::io::stdout().is_terminal() && args.output.is_none();
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
            if terminal {
                print!("\x1b[H\x1b[2J{text}\n{}", style_hint(style));
            } else {
                if !last.is_empty() {
                    println!();
                }
                print!("{text}");
            }
            use std::io::Write as _;
            std::io::stdout().flush().ok();
            last = text;
        }
        if op.status.as_ref().is_some_and(|s| s.phase.is_finished()) {
            return Ok(Status::Success);
        }
        // Blocked stays Blocked until a person acts: say why and how, and stop watching.
        if args.output.is_none()
            && let Some(summary) = render::blocked_summary(&op, &tasks)
        {
            print!("\n{summary}");
            return Ok(Status::Blocked);
        }
        tokio::select! {
            event = events.next() => match event {
                None => bail!("the watch on Operation {name} ended unexpectedly"),
                // The watcher retries with backoff; a failed round is reported, not fatal.
                Some(Err(e)) => eprintln!("warning: watching Operation {name}: {e}"),
                Some(Ok(())) => {}
            },
            _ = tick.tick(), if terminal => {}
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
    let text = match output {
        Some(Format::Json) => {
            serde_json::to_string_pretty(
                &serde_json::json!({ "clusterLifecycle": cl, "operations": generated }),
            )? + "\n"
        }
        Some(Format::Yaml) => serde_yaml::to_string(
            &serde_json::json!({ "clusterLifecycle": cl, "operations": generated }),
        )?,
        None => {
            let cl = terminal::cleaned(&cl)?;
            let generated = generated
                .iter()
                .map(terminal::cleaned)
                .collect::<Result<Vec<_>>>()?;
            render::lifecycle(&cl, &generated, Timestamp::now(), style)
        }
    };
    print!("{text}");
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
        println!("approved {} (NodeTask {name})", task.spec.node_name);
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
        .and_then(|s| s.current_step.clone())
        .unwrap_or_else(|| "its failed step".into());
    match recovery {
        bosun_api::Recovery::Retry => println!(
            "recovery: Retry set on NodeTask {name}: the controller runs step {step} on {} again",
            args.node
        ),
        bosun_api::Recovery::Skip => println!(
            "recovery: Skip set on NodeTask {name}: {} is left as it is (from step {step} on) and the Operation moves on",
            args.node
        ),
    }
    println!(
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
        println!(
            "paused {}: running steps finish, nothing new starts; resume with `kubectl bosun resume {}`",
            args.operation, args.operation
        );
    } else {
        println!("resumed {}", args.operation);
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
    let task = for_people(task)?;
    print!(
        "{}",
        render::logs(&task, args.step.as_deref(), Timestamp::now())
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
}
