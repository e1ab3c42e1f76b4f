//! The Bosun node agent: runs its own node's NodeTask steps as signed plugins.
//!
//! The agent watches only NodeTasks labelled `bosun.dev/node=<its node>` (and, with
//! `--instance`, `bosun.dev/instance=<instance>`). When a task is
//! Running (the controller gave it its turn) and its next step runs on the agent, the agent
//! resolves the step's Plugin (see [`plugins`]), and runs it through `bosun-host` with the
//! Plugin's grants (see [`step`]): the host verifies digest and signature before compiling,
//! runs preflight, then the action. The agent writes the step's status (times with
//! microseconds, outcome, bounded log tail, preflight results) with server-side apply, and
//! on a failure moves the task to Blocked with the reason. Finishing a task (Succeeded) is
//! the controller's call, once every step succeeded.
//!
//! Node facts: the agent reports what it finds on its node (kubelet and kubeadm versions,
//! OS, kernel, certificate expiry) in `status.nodeFacts`: `before` with the start of the
//! task's first agent step, `after` with the result of its last one, read again once the
//! task finished and written anew only if they changed (see [`facts`]).
//!
//! Restart rule: a step found Running when the agent (re)starts was interrupted; it runs
//! again only if the plugin declares the action idempotent, otherwise the task blocks as
//! Interrupted for a person to decide. The run after an interrupted attempt (the agent's own
//! re-run, or a person's retry of the Interrupted block) tells the plugin so with
//! `run-context.resumed` (see [`resumes_interrupted`]).
//!
//! Failed status writes (an API error, the API server restarting mid-upgrade) never leave
//! a step Running for good, and never make a plugin run twice for one attempt: a failed
//! start write leaves the step as it was (no plugin ran; the next reconcile starts it
//! afresh); a failed result write keeps the result in memory and sends it again, with
//! backoff, until it lands (see [`StepRun`]). Only if the agent exits before that does the
//! restart rule decide.
//!
//! Cordon: a step that runs inside the window of the task's cordon (after its `cordon`
//! succeeded, before its `uncordon`) does not start on a node someone else uncordoned
//! meanwhile; the task blocks as CordonCleared (see [`bosun_cluster::cordon`]).
//!
//! Reboots: a step marked `awaitNewBoot` records the node's boot identity when it starts
//! and finishes only when an agent finds another one, without running its plugin again; a
//! restart in the same boot is not a reboot (see [`boot`]).
//!
//! Pause: no new step of a task marked `bosun.dev/paused` (set by the controller while its
//! Operation is paused) starts; a running step finishes.

pub mod backends;
pub mod boot;
pub mod facts;
pub mod fleet;
pub mod gate;
pub mod plugins;
pub mod preflight;
pub mod report;
pub mod step;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bosun_api::labels;
use bosun_api::node_task::{BlockReason, NodeTask, NodeTaskPhase, NodeTaskStatus, StepPhase};
use bosun_api::operation::RunsOn;
use bosun_cluster::status::{StepEnd, StepReport, StepWrite, TaskStatusWrite, step_manager};
use bosun_host::Host;
use bosun_planner::state::{
    Progress, StepEvent, TaskEvent, progress, step_status, step_transition, task_transition,
};
use bosun_telemetry::Watched;
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::{Controller, watcher};
use kube::{Client, ResourceExt};
use tracing::Instrument;

use crate::plugins::{Store, resolve};
use crate::step::StepResult;

/// The agent's errors: API calls and state transitions. A step that fails is not an error
/// here; it is a Failed step in status.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed, or a state transition was refused.
    #[error(transparent)]
    Cluster(#[from] bosun_cluster::Error),
    #[error("the step runner thread stopped: {0}")]
    Join(#[from] tokio::task::JoinError),
    /// A policy gate cannot decide yet (the Policy objects are not listed): nothing runs.
    #[error("policy gate: {0}")]
    Gate(String),
}

/// What every reconcile of the agent shares.
pub struct Agent {
    pub client: Client,
    pub node_name: String,
    pub host: Arc<Host>,
    pub store: Store,
    /// The HTTP client for `url` and `oci` plugin sources (see [`bosun_fetch`]).
    pub fetcher: bosun_fetch::Fetcher,
    /// Field manager for server-side apply of step status.
    pub manager: String,
    /// (task uid, step) → the latest attempt of that step this process started, and what
    /// became of it (see [`StepRun`]).
    runs: std::sync::Mutex<std::collections::HashMap<(String, String), StepRun>>,
    /// `--instance`: act only on NodeTasks labelled `bosun.dev/instance=<instance>`
    /// (without it, only on NodeTasks without that label); see
    /// [`bosun_cluster::instance_selector`].
    pub instance: Option<String>,
    /// The Policy objects of this agent's instance, compiled once per change of the set:
    /// the capabilities and step gates (see [`gate`]).
    pub policies: Arc<bosun_cluster::policies::PolicyWatch>,
    /// Thresholds of the built-in preflight checks (see [`preflight`]).
    pub preflight: preflight::Settings,
    /// The node-facts reports this process wrote (see [`facts`]).
    pub facts_written: facts::Written,
    /// Wakes the standing NodeReport ([`report::run`]) before its period: a task finished
    /// here, so the node's facts have likely changed (an upgraded kubelet, renewed
    /// certificates).
    pub report_now: Arc<report::ReportNow>,
    /// Task name → reconciles of it that failed in a row (see [`error_policy`]); removed by
    /// the next one that succeeds.
    failures: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    /// Give the plugin host's memory back after each step ([`Host::release_memory`]): set
    /// by the agent binary, which runs a step a few times a year and otherwise idles; left
    /// off by the fleet harness, whose agents share one host and run steps back to back.
    pub release_memory_after_step: bool,
    /// Steps (and loads of an interrupted step's plugin) this process is in; memory is
    /// released when the last one ends.
    in_flight: std::sync::atomic::AtomicUsize,
    /// Where the node's boot identity is read, for the steps that reboot it.
    pub boot: boot::BootSource,
}

/// Held while a step of `agent` runs; the last one to end releases the host's memory
/// when the agent asks for that.
struct InFlight<'a>(&'a Agent);

impl<'a> InFlight<'a> {
    fn enter(agent: &'a Agent) -> InFlight<'a> {
        agent
            .in_flight
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        InFlight(agent)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let left = self
            .0
            .in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst)
            - 1;
        if left == 0 && self.0.release_memory_after_step {
            let dropped = self.0.host.release_memory();
            tracing::debug!(dropped, "released the plugin host's memory after the step");
        }
    }
}

impl Agent {
    /// The publisher of this agent's Events (reporter `bosun.dev/agent`, instance its node).
    pub fn events(&self) -> bosun_cluster::events::Publisher {
        bosun_cluster::events::Publisher::new(
            self.client.clone(),
            bosun_cluster::events::AGENT,
            self.node_name.clone(),
        )
    }

    /// An agent for `node_name`.
    pub fn new(
        client: Client,
        node_name: String,
        host: Arc<Host>,
        store: Store,
        fetcher: bosun_fetch::Fetcher,
        manager: String,
    ) -> Agent {
        Agent {
            client,
            node_name,
            host,
            store,
            fetcher,
            manager,
            runs: Default::default(),
            instance: None,
            policies: Default::default(),
            preflight: Default::default(),
            facts_written: Default::default(),
            report_now: Default::default(),
            failures: Default::default(),
            release_memory_after_step: false,
            in_flight: Default::default(),
            boot: Default::default(),
        }
    }

    /// The runs table (a panic elsewhere while holding it leaves it usable: every entry is
    /// written whole).
    fn runs(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<(String, String), StepRun>> {
        self.runs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// This process's latest attempt of `step` of `task`: its number, and whether its result
    /// is ours to write (written, or kept to send again) rather than still owed.
    fn our_attempt(&self, task: &NodeTask, step: &str) -> Option<(u32, bool)> {
        self.runs().get(&run_key(task, step)).map(|run| match run {
            StepRun::Started(n) => (*n, false),
            StepRun::Written(n) => (*n, true),
            StepRun::Unsent(u) => (u.attempt, true),
        })
    }

    fn record(&self, task: &NodeTask, step: &str, run: StepRun) {
        self.runs().insert(run_key(task, step), run);
    }
}

fn run_key(task: &NodeTask, step: &str) -> (String, String) {
    (task.uid().unwrap_or_default(), step.to_string())
}

/// What this process knows of the latest attempt of one step it started. The watch cache
/// may lag behind this process's own writes: this tells a stale status (fewer attempts than
/// ours, or our attempt still Running after its result was written) from a step to start
/// or an interrupted one.
///
/// An attempt is recorded only once its start write (the step as Running) succeeded: a
/// failed start write records nothing, so the next reconcile starts the step afresh, and
/// no plugin ran for the attempt that was not written.
#[derive(Debug)]
enum StepRun {
    /// The start write succeeded and no result was recorded. Reconciles of one task never
    /// overlap (kube's controller runs one at a time per object), so a later reconcile that
    /// finds this with the step Running at this attempt knows the run ended without a
    /// result (an error between the two writes): the step was interrupted, as by a restart.
    Started(u32),
    /// The result was written.
    Written(u32),
    /// The result write failed: the result is kept and sent again by later reconciles (see
    /// [`resend_result`]); the plugin never runs again for this attempt.
    Unsent(Box<Unsent>),
}

/// A step result this process could not write yet.
#[derive(Debug)]
struct Unsent {
    attempt: u32,
    /// The status the result write applies; sent again unchanged.
    body: TaskStatusWrite,
    /// Failed writes of it so far (at least 1).
    failures: u32,
    /// Not sent again before this.
    next_try: Instant,
}

/// How soon to look again when the watch cache has not caught up with our own write.
const STALE_RETRY: Duration = Duration::from_millis(300);

/// Wait before sending a step result again after its first failed write; doubles with
/// each further failure up to [`RESULT_RETRY_MAX`].
const RESULT_RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between two sends of a step result that keeps failing. It is sent
/// again for as long as the agent runs: dropping it would leave the step Running forever.
/// Short, because the usual cause is an API server that kubeadm restarts: each second
/// between its return and the next send is dead time in the Operation (30 s made a 40 s
/// outage cost 10 s more). One small patch per node with a finished step, so even a large
/// fleet sends few.
const RESULT_RETRY_MAX: Duration = Duration::from_secs(8);

/// The wait after the `failures`-th failed write of a step result.
fn result_backoff(failures: u32) -> Duration {
    RESULT_RETRY_FIRST
        .saturating_mul(1 << failures.saturating_sub(1).min(16))
        .min(RESULT_RETRY_MAX)
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("node_name", &self.node_name)
            .field("store", &self.store)
            .finish_non_exhaustive()
    }
}

/// Runs the agent until SIGTERM / Ctrl-C. Watches the NodeTasks of its node and instance.
pub async fn run(agent: Arc<Agent>) {
    let tasks: Api<NodeTask> = Api::all(agent.client.clone());
    let selector = task_selector(&agent.node_name, agent.instance.as_deref());
    // Policies of the same instance as the tasks; until they are listed, no step runs.
    if let Some(watch) = agent.policies.drive(
        agent.client.clone(),
        Some(bosun_cluster::instance_selector(agent.instance.as_deref())),
    ) {
        tokio::spawn(watch);
    }
    // The NodeTask watch, as `Controller::new` builds it, with its lists counted
    // (`bosun_watch_lists_total`), opened again when it stalls while the agent waits for
    // the controller (a controller step, the health gates) and the API server holds a
    // newer task than the watch brought (`bosun_cluster::watch::keep_fresh`).
    let liveness = bosun_cluster::watch::Liveness::new(Watched::NodeTasks);
    let (triggers, store) = bosun_cluster::watch::counted_controller_source(
        tasks.clone(),
        watcher::Config::default().labels(&selector),
        liveness.clone(),
    );
    tokio::spawn(bosun_cluster::watch::keep_fresh(
        tasks,
        store.clone(),
        liveness,
        bosun_cluster::watch::FRESHNESS,
        NodeTask::waits_on_controller,
    ));
    Controller::for_stream(triggers, store)
        .trigger_backoff(bosun_cluster::watch::WatchBackoff::new(
            bosun_cluster::watch::seed_of(&agent.node_name),
        ))
        .shutdown_on_signal()
        .run(reconcile, error_policy, agent)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "reconcile error");
            }
        })
        .await;
}

/// The label selector of the NodeTasks an agent on `node_name` runs: its node's label and
/// its instance.
///
/// The node label's value goes through [`bosun_planner::label_value`], the function the
/// planner writes the label with: a node name longer than 63 characters is shortened the
/// same way on both sides, so the agent of such a node still sees its tasks.
pub fn task_selector(node_name: &str, instance: Option<&str>) -> String {
    format!(
        "{}={},{}",
        labels::NODE,
        bosun_planner::label_value(node_name),
        bosun_cluster::instance_selector(instance)
    )
}

/// The wait before the first retry of a failed reconcile.
pub const RETRY_FIRST: Duration = Duration::from_secs(5);
/// The longest wait between retries of a reconcile that keeps failing.
pub const RETRY_MAX: Duration = Duration::from_secs(60);

/// The wait before retrying a reconcile that failed `failures` times in a row (1: the first
/// failure): [`RETRY_FIRST`], doubled with each further failure up to [`RETRY_MAX`], then
/// ±25 % picked by `seed` (a hash of node and task) so that agents that failed together do
/// not all come back together. At 1,000 nodes a fixed 5 s kept an overloaded API server
/// overloaded (docs/benchmarks.md).
pub fn retry_wait(failures: u32, seed: u64) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    let wait = RETRY_FIRST.saturating_mul(1 << doublings).min(RETRY_MAX);
    // A xorshift of the seed and the count picks the factor.
    let x = (seed ^ u64::from(failures).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1;
    bosun_cluster::watch::jittered(wait, bosun_cluster::watch::xorshift(x))
}

/// Retry a failed reconcile (an API error) later: see [`retry_wait`].
pub fn error_policy(task: Arc<NodeTask>, error: &Error, agent: Arc<Agent>) -> Action {
    let name = task.name_any();
    let failures = {
        let mut failures = agent
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = failures.entry(name.clone()).or_default();
        *n = n.saturating_add(1);
        *n
    };
    let seed = bosun_cluster::watch::seed_of(&format!("{}/{name}", agent.node_name));
    let wait = retry_wait(failures, seed);
    tracing::warn!(task = %name, %error, failures, retry_in = ?wait, "agent reconcile failed; retrying");
    Action::requeue(wait)
}

/// One look at one of this node's NodeTasks: run its next agent step if it is its turn.
///
/// Guarantees: runs nothing unless the task is Running (the controller's decision) and the
/// next step in spec order runs on the agent; never runs a step after a failed one; writes
/// the step as Running (with its start time) before the plugin starts, so a restart can
/// tell an interrupted step; runs the plugin at most once per attempt, and a result whose
/// write failed is sent again (see [`StepRun`]) instead of the step staying Running.
pub async fn reconcile(task: Arc<NodeTask>, agent: Arc<Agent>) -> Result<Action, Error> {
    let result = reconcile_once(&task, &agent).await;
    if result.is_ok() {
        agent
            .failures
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&task.name_any());
    }
    result
}

async fn reconcile_once(task: &Arc<NodeTask>, agent: &Arc<Agent>) -> Result<Action, Error> {
    let (task, agent) = (task.clone(), agent.clone());
    if task.spec.node_name != agent.node_name {
        return Ok(Action::await_change());
    }
    // Node facts first: `before` when the task is first seen Running (before its first
    // step), `after` once it finished.
    facts::report_if_due(&agent, &task).await?;
    let status = task.status.clone().unwrap_or_default();
    if status.phase != NodeTaskPhase::Running {
        return Ok(Action::await_change());
    }
    if let Some(action) = resend_result(&task, &status, &agent).await {
        return Ok(action);
    }
    let seen = |index: usize| {
        step_status(&status.steps, &task.spec.steps[index].name).map_or(0, |s| s.attempts)
    };
    let ours = |index: usize| agent.our_attempt(&task, &task.spec.steps[index].name);
    // A step that asked for the node's reboot, seen by the cache: it waits for a new boot.
    let asked_reboot = |index: usize| {
        task.spec.steps[index].await_new_boot
            && step_status(&status.steps, &task.spec.steps[index].name)
                .is_some_and(|s| s.reboot_requested_at.is_some())
    };
    match progress(&task.spec.steps, &status.steps) {
        // The cache has not seen our start write yet.
        Progress::Next {
            index,
            runs_on: RunsOn::Agent,
        } if ours(index).is_some_and(|(n, _)| n > seen(index)) => Ok(Action::requeue(STALE_RETRY)),
        // The cache has not seen our result write yet. (Our attempt Running with no result:
        // its run ended without one; handled below as interrupted.)
        Progress::Running {
            index,
            runs_on: RunsOn::Agent,
        } if !asked_reboot(index)
            && ours(index)
                .is_some_and(|(n, result)| n > seen(index) || (result && n == seen(index))) =>
        {
            Ok(Action::requeue(STALE_RETRY))
        }
        // A step that reboots the node, found Running: another boot finishes it.
        Progress::Running {
            index,
            runs_on: RunsOn::Agent,
        } if task.spec.steps[index].await_new_boot => {
            let entry = step_status(&status.steps, &task.spec.steps[index].name)
                .cloned()
                .unwrap_or_default();
            match boot::check(&entry, agent.boot.read().as_deref()) {
                boot::Check::Booted { from, to } => {
                    boot::finish_booted(&task, index, &agent, &from, &to).await?;
                }
                boot::Check::Waiting => tracing::info!(
                    task = %task.name_any(),
                    step = %task.spec.steps[index].name,
                    "the reboot was asked for; waiting for the node's new boot"
                ),
                boot::Check::Interrupted => interrupted(&task, index, &agent).await?,
            }
            Ok(Action::await_change())
        }
        // The Operation is paused: no new step starts (the controller removes the mark on
        // resume, and that change wakes this reconcile). Said in the log, once per change of
        // the task, so a reader (and a test) can see the agent held the step.
        Progress::Next {
            index,
            runs_on: RunsOn::Agent,
        } if bosun_cluster::is_paused(&task) => {
            tracing::info!(
                task = %task.name_any(),
                step = %task.spec.steps[index].name,
                "step waits: the Operation is paused"
            );
            Ok(Action::await_change())
        }
        Progress::Next {
            index,
            runs_on: RunsOn::Agent,
        } => run_step(&task, index, &agent).await,
        Progress::Running {
            index,
            runs_on: RunsOn::Agent,
        } => {
            interrupted(&task, index, &agent).await?;
            Ok(Action::await_change())
        }
        _ => Ok(Action::await_change()),
    }
}

async fn run_step(task: &NodeTask, index: usize, agent: &Agent) -> Result<Action, Error> {
    let step = &task.spec.steps[index];
    let span = tracing::info_span!("step", operation = %task.spec.operation, node = %agent.node_name, step = %step.name, plugin = step.plugin.as_deref().unwrap_or(""));
    let _in_flight = InFlight::enter(agent);
    run_step_inner(task, index, agent).instrument(span).await
}

/// Starts attempt n+1 of step `index`: writes it Running, runs the plugin once, writes the
/// result. A failed start write is an error with nothing recorded (no plugin ran); a failed
/// result write is not an error: the result is kept to send again (see [`resend_result`]).
async fn run_step_inner(task: &NodeTask, index: usize, agent: &Agent) -> Result<Action, Error> {
    // Policies and facts first: if they cannot be had, the step is not started at all.
    let prepared = Arc::new(gate::prepare(agent, task).await?);
    // Inside the window of the task's cordon, the node must still be cordoned: someone
    // else may have uncordoned it since (the Node was read just now, from the API server).
    if let Some(message) = bosun_cluster::cordon::refusal(task, index, prepared.unschedulable()) {
        return refuse_cordon_cleared(task, index, agent, message).await;
    }
    let started = start_attempt(task, index, agent, &prepared).await?;
    let attempt = started.attempts;
    let result = if task.spec.steps[index].await_new_boot && started.boot_id.is_none() {
        StepResult::failed(
            BlockReason::StepFailed,
            "boot-identity-unknown",
            format!(
                "step {} reboots the node, and the agent cannot read the node's boot identity (/proc/sys/kernel/random/boot_id and /proc/1/stat), so it could not tell the new boot: the plugin was not run; check that the agent runs with hostPID, then retry",
                task.spec.steps[index].name
            ),
            false,
        )
    } else {
        run_plugin(task, index, agent, &prepared, started.resumed).await?
    };
    let body = result_body(task, index, agent, &prepared, started, result).await?;
    send_result(task, index, agent, &prepared, attempt, body).await
}

/// An attempt the agent has written Running, and what its result write needs.
struct Started {
    phase: StepPhase,
    attempts: u32,
    resumed: bool,
    /// The task's last agent step: its result carries the `after` facts.
    last_agent_step: usize,
    /// The node facts this step's writes carry.
    carried: serde_json::Map<String, serde_json::Value>,
    /// For a step that reboots the node: the boot identity when it started.
    boot_id: Option<String>,
    at: Timestamp,
    clock: Instant,
}

/// Writes attempt n+1 of step `index` Running (with the node facts it carries), then records
/// that it started. A failed write is an error, and nothing is owed: no plugin ran.
async fn start_attempt(
    task: &NodeTask,
    index: usize,
    agent: &Agent,
    prepared: &gate::Prepared,
) -> Result<Started, Error> {
    let step = &task.spec.steps[index];
    let name = task.name_any();
    let previous = step_status(&task.status.clone().unwrap_or_default().steps, &step.name)
        .cloned()
        .unwrap_or_default();
    let phase = step_transition(previous.phase, StepEvent::Start)
        .map_err(bosun_cluster::Error::transition(&name))?;
    let attempts = previous.attempts + 1;
    // Read before the start write below replaces the previous attempt's entry.
    let resumed = resumes_interrupted(&previous);
    // Node facts this step's writes carry (see `facts`): `before` for the task's first agent
    // step, read now (before the step starts) unless the task has it already; and whatever
    // this step's manager wrote before, but not an `after` of an earlier run of this step.
    let manager = step_manager(&agent.manager, &step.name);
    let (first, last_agent_step) = facts::agent_steps(task).unwrap_or((index, index));
    let mut carried = facts::carried(agent, task, &manager);
    carried.remove("after");
    let has_before = task
        .status
        .as_ref()
        .and_then(|s| s.node_facts.as_ref())
        .is_some_and(|f| f.before.is_some());
    if index == first && !has_before && !carried.contains_key("before") {
        let kubelet = prepared.kubelet_version();
        carried.insert(
            "before".into(),
            facts::read_before(agent, task, kubelet).await,
        );
    }
    let boot_id = step.await_new_boot.then(|| agent.boot.read()).flatten();
    let at = Timestamp::now();
    let clock = Instant::now();
    let mut write = TaskStatusWrite::step_started(&step.name, phase, attempts, at)
        .with_facts(Some(serde_json::Value::Object(carried.clone())));
    write.steps[0].boot_id.clone_from(&boot_id);
    apply_status(agent, &name, &step.name, &write).await?;
    // Recorded only now: had the start write failed, nothing ran and nothing is owed.
    agent.record(task, &step.name, StepRun::Started(attempts));
    if resumed {
        tracing::info!(
            attempt = attempts,
            "step started; the previous attempt was interrupted (the plugin is told it resumes)"
        );
    } else {
        tracing::info!("step started");
    }
    Ok(Started {
        phase,
        attempts,
        resumed,
        last_agent_step,
        carried,
        boot_id,
        at,
        clock,
    })
}

/// Resolves the step's Plugin and runs it once through the host.
async fn run_plugin(
    task: &NodeTask,
    index: usize,
    agent: &Agent,
    prepared: &Arc<gate::Prepared>,
    resumed: bool,
) -> Result<StepResult, Error> {
    let step = &task.spec.steps[index];
    Ok(match step.plugin.as_deref() {
        None => StepResult::failed(
            BlockReason::PluginUnavailable,
            "no-plugin",
            format!("agent step {} names no plugin", step.name),
            false,
        ),
        Some(named) => {
            let choice = match choose_backend(agent, &prepared.os(), named).await {
                Ok(choice) => choice,
                Err(refused) => return Ok(*refused),
            };
            match resolve(&agent.client, &agent.store, &agent.fetcher, &choice.plugin).await {
                Err(e) => StepResult::failed(
                    BlockReason::PluginUnavailable,
                    "plugin-unavailable",
                    e.to_string(),
                    true,
                ),
                Ok(resolved) => {
                    let result = prepared
                        .clone()
                        .run(agent, task, index, resolved, resumed)
                        .await?;
                    backend_noted(result, &agent.node_name, &prepared.os(), named, &choice)
                }
            }
        }
    })
}

/// The Plugin that runs a step naming `named` on this node ([`backends::choose`]), from
/// every Plugin of the cluster and this node's os-release. A refusal, or a failed list, is
/// the step's failed result (PluginUnavailable; tried again on a retry).
async fn choose_backend(
    agent: &Agent,
    os: &backends::NodeOs,
    named: &str,
) -> Result<backends::Choice, Box<StepResult>> {
    let plugins: Api<bosun_api::plugin::Plugin> = Api::all(agent.client.clone());
    let listed = plugins
        .list(&ListParams::default())
        .await
        .map_err(|e| {
            Box::new(StepResult::failed(
                BlockReason::PluginUnavailable,
                "plugin-unavailable",
                format!(
                    "listing the Plugins, to choose the one that serves this node's OS family for `{named}` steps: {e}"
                ),
                true,
            ))
        })?;
    backends::choose(&agent.node_name, os, named, &listed.items).map_err(|e| {
        let code = match e {
            backends::BackendError::Ambiguous { .. } => "backend-ambiguous",
            backends::BackendError::NoneServes { .. } => "no-backend",
        };
        tracing::warn!(step_plugin = named, error = %e, "no backend chosen");
        Box::new(StepResult::failed(
            BlockReason::PluginUnavailable,
            code,
            e.to_string(),
            true,
        ))
    })
}

/// `result` with the backend that ran it named: a step run by a backend says so in its
/// message, and a backend whose preflight refused this node is named with the family it
/// claimed and the plugins that were considered.
fn backend_noted(
    mut result: StepResult,
    node: &str,
    os: &backends::NodeOs,
    named: &str,
    choice: &backends::Choice,
) -> StepResult {
    let Some(family) = &choice.family else {
        return result;
    };
    let plugin = &choice.plugin;
    result.message = if result.block == Some(BlockReason::PreflightFailed) {
        format!(
            "node {node} ({}): Plugin {plugin} claims OS family {family} for `{named}` steps (spec.backend), and its preflight refused this node: {}; considered: {}; correct the claim (spec.backend.osFamilies) or the node, then retry",
            os.describe(),
            result.message,
            choice.considered.join(", ")
        )
    } else {
        format!(
            "{} (run by Plugin {plugin}, the backend for `{named}` steps on OS family {family})",
            result.message
        )
    };
    if let Some(error) = result.error.as_mut() {
        error.message.clone_from(&result.message);
    }
    result
}

/// The status write of a finished attempt: the step's end (and the task's block, on a
/// failure), its report, and the node facts (`after` once the task's last agent step
/// succeeded, read now).
async fn result_body(
    task: &NodeTask,
    index: usize,
    agent: &Agent,
    prepared: &gate::Prepared,
    started: Started,
    result: StepResult,
) -> Result<TaskStatusWrite, Error> {
    let step = &task.spec.steps[index];
    let name = task.name_any();
    let finished = Timestamp::now();
    bosun_telemetry::metrics().step_finished(
        bosun_telemetry::Side::Agent,
        bosun_telemetry::StepOutcome::from_block(result.block),
        started.clock.elapsed(),
    );
    let event = if result.phase == StepPhase::Succeeded {
        StepEvent::Succeeded
    } else {
        StepEvent::Failed
    };
    let end_phase =
        step_transition(started.phase, event).map_err(bosun_cluster::Error::transition(&name))?;
    let block = match result.block {
        Some(reason) => {
            let next = task_transition(NodeTaskPhase::Running, TaskEvent::StepFailed)
                .map_err(bosun_cluster::Error::transition(&name))?;
            tracing::warn!(reason = ?reason, outcome = %result.message, "step failed; task blocked");
            Some((next, reason))
        }
        None => {
            tracing::info!(outcome = %result.message, host = ?result.host_time, "step succeeded");
            None
        }
    };
    let report = StepReport {
        outputs: result.outputs.into_iter().collect(),
        log_tail: result.log_tail,
        preflight: result.preflight,
        policy: prepared.decision(),
        host_milliseconds: u64::try_from(result.host_time.as_millis()).unwrap_or(u64::MAX),
    };
    // A step that reboots the node and asked for it stays Running until the new boot.
    if let Some(boot_id) = started
        .boot_id
        .as_deref()
        .filter(|_| step.await_new_boot && end_phase == StepPhase::Succeeded && !task.spec.dry_run)
    {
        tracing::info!(
            boot = boot_id,
            "the reboot was asked for; the step waits for the node's new boot"
        );
        let entry = boot::waiting_entry(
            &step.name,
            started.attempts,
            started.at,
            boot_id,
            finished,
            result.message,
            report,
        );
        let mut write = TaskStatusWrite::step(entry);
        write.message = Some(format!(
            "step {}: the reboot was asked for; waiting for the node to come back with a new boot",
            step.name
        ));
        return Ok(write.with_facts(Some(serde_json::Value::Object(started.carried))));
    }
    let mut entry = StepWrite::finished(
        &step.name,
        started.attempts,
        started.at,
        finished,
        StepEnd {
            phase: end_phase,
            changed: result.changed,
            message: result.message,
            error: result.error,
        },
        Some(report),
    );
    entry.boot_id = started.boot_id.clone();
    let mut carried = started.carried;
    if index == started.last_agent_step && end_phase == StepPhase::Succeeded {
        carried.insert("after".into(), facts::read_after(agent, task).await);
    }
    Ok(TaskStatusWrite::step_finished(entry, block)
        .with_facts(Some(serde_json::Value::Object(carried))))
}

/// Sends a finished attempt's result. A failed write is not an error: the result is kept and
/// sent again with backoff (the plugin does not run again).
async fn send_result(
    task: &NodeTask,
    index: usize,
    agent: &Agent,
    prepared: &gate::Prepared,
    attempts: u32,
    body: TaskStatusWrite,
) -> Result<Action, Error> {
    let step = &task.spec.steps[index];
    let written = apply_status(agent, &task.name_any(), &step.name, &body).await;
    // The policy decision was made whether or not its status landed yet.
    prepared.publish_events(agent, task, &step.name).await;
    match written {
        Ok(()) => {
            result_landed(agent, task, &body);
            agent.record(task, &step.name, StepRun::Written(attempts));
            // The write triggers another reconcile for the next step.
            Ok(Action::await_change())
        }
        Err(error) => {
            let wait = result_backoff(1);
            tracing::warn!(%error, retry_in = ?wait, "writing the step's result failed; it is kept and sent again (the plugin does not run again)");
            agent.record(
                task,
                &step.name,
                StepRun::Unsent(Box::new(Unsent {
                    attempt: attempts,
                    body,
                    failures: 1,
                    next_try: Instant::now() + wait,
                })),
            );
            Ok(Action::requeue(wait))
        }
    }
}

/// Step `index` runs inside the window of the task's cordon and someone else uncordoned the
/// node (see [`bosun_cluster::cordon`]): the plugin is not started. One write records the
/// refused attempt as Failed (attempt n+1, started and finished now, error `cordon-cleared`,
/// not retryable: a person decides) and blocks the task as CordonCleared, the way a
/// controller step that fails in its first pass is written; no Running write, since nothing
/// ran that a restart would have to tell from a finished step. A Warning Event
/// `CordonCleared` on the NodeTask says the same. If the write fails, nothing is recorded
/// and the next reconcile decides again on the Node as it is then.
async fn refuse_cordon_cleared(
    task: &NodeTask,
    index: usize,
    agent: &Agent,
    message: String,
) -> Result<Action, Error> {
    let step = &task.spec.steps[index];
    let name = task.name_any();
    let previous = step_status(&task.status.clone().unwrap_or_default().steps, &step.name)
        .cloned()
        .unwrap_or_default();
    let started = step_transition(previous.phase, StepEvent::Start)
        .map_err(bosun_cluster::Error::transition(&name))?;
    let failed = step_transition(started, StepEvent::Failed)
        .map_err(bosun_cluster::Error::transition(&name))?;
    let blocked = task_transition(NodeTaskPhase::Running, TaskEvent::StepFailed)
        .map_err(bosun_cluster::Error::transition(&name))?;
    let attempts = previous.attempts + 1;
    let now = Timestamp::now();
    // The node facts this step's manager wrote before, as every write of it carries them.
    let mut carried = facts::carried(agent, task, &step_manager(&agent.manager, &step.name));
    carried.remove("after");
    let reason = BlockReason::CordonCleared;
    let entry = StepWrite::finished(
        &step.name,
        attempts,
        now,
        now,
        StepEnd {
            phase: failed,
            changed: false,
            message: message.clone(),
            error: Some(bosun_api::node_task::StepError {
                code: bosun_cluster::cordon::CODE.to_string(),
                message: message.clone(),
                retryable: false,
            }),
        },
        None,
    );
    let body = TaskStatusWrite::step_finished(entry, Some((blocked, reason)))
        .with_facts(Some(serde_json::Value::Object(carried)));
    apply_status(agent, &name, &step.name, &body).await?;
    agent.record(task, &step.name, StepRun::Written(attempts));
    bosun_telemetry::metrics().step_finished(
        bosun_telemetry::Side::Agent,
        bosun_telemetry::StepOutcome::from_block(Some(reason)),
        Duration::ZERO,
    );
    tracing::warn!(attempt = attempts, outcome = %message, "step not started: the node's cordon was cleared; task blocked");
    agent
        .events()
        .publish(
            task,
            &bosun_cluster::events::Notice::warning(
                reason.as_str(),
                "CheckCordon",
                format!("step {}: {message}", step.name),
            ),
        )
        .await;
    Ok(Action::await_change())
}

/// A step result landed: if it carried `after`, the facts are read again once the task
/// finished (see [`facts`]).
fn result_landed(agent: &Agent, task: &NodeTask, body: &TaskStatusWrite) {
    if body
        .node_facts
        .as_ref()
        .is_some_and(|f| f.get("after").is_some())
    {
        agent
            .facts_written
            .carried_after(&task.uid().unwrap_or_default());
    }
}

/// Sends again a step result of this task that this process could not write (see
/// [`StepRun::Unsent`]), if the task still shows that attempt Running and its backoff is
/// over. `None` when there is nothing to send (or it no longer needs sending): go on.
///
/// Guarantees: never runs a plugin; sends a result only over the attempt it belongs to
/// (a status showing a later attempt, or the attempt finished, means the write landed
/// after all or the step moved on: the kept result is dropped); keeps a result whose write
/// fails again, waiting up to [`RESULT_RETRY_MAX`] between tries.
async fn resend_result(task: &NodeTask, status: &NodeTaskStatus, agent: &Agent) -> Option<Action> {
    let name = task.name_any();
    for step in &task.spec.steps {
        let (attempt, body, failures, next_try) = match agent.runs().get(&run_key(task, &step.name))
        {
            Some(StepRun::Unsent(u)) => (u.attempt, u.body.clone(), u.failures, u.next_try),
            _ => continue,
        };
        let (seen, running) = step_status(&status.steps, &step.name)
            .map_or((0, false), |s| (s.attempts, s.phase == StepPhase::Running));
        if seen < attempt {
            // The cache has not seen our start write yet.
            return Some(Action::requeue(STALE_RETRY));
        }
        if seen > attempt || !running {
            // The write landed after all (only its reply was lost) or the step moved on
            // (a retry, a skip): nothing is owed.
            agent.record(task, &step.name, StepRun::Written(attempt));
            continue;
        }
        let wait = next_try.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            return Some(Action::requeue(wait));
        }
        return Some(match apply_status(agent, &name, &step.name, &body).await {
            Ok(()) => {
                result_landed(agent, task, &body);
                tracing::info!(task = %name, step = %step.name, attempt, failures, "step result written after failed writes");
                agent.record(task, &step.name, StepRun::Written(attempt));
                Action::await_change()
            }
            Err(error) => {
                let failures = failures + 1;
                let wait = result_backoff(failures);
                tracing::warn!(task = %name, step = %step.name, attempt, failures, %error, retry_in = ?wait, "writing the step's result failed again; it is kept and sent again");
                agent.record(
                    task,
                    &step.name,
                    StepRun::Unsent(Box::new(Unsent {
                        attempt,
                        body,
                        failures,
                        next_try: Instant::now() + wait,
                    })),
                );
                Action::requeue(wait)
            }
        });
    }
    None
}

/// Whether the attempt about to start after `previous` (the step's status entry as read
/// before the start write) follows an interrupted one: the previous attempt started the
/// plugin and no result of it was recorded. That is a step back at Pending after at least
/// one attempt with no error recorded by the agent: [`interrupted`] moves an idempotent
/// step from Running back to Pending writing no error (the agent re-runs it), and blocks a
/// non-idempotent one as Failed writing no error either (a person's retry then makes it
/// Pending, and the controller's retry write leaves the agent's fields alone). Every failure
/// the agent records carries an error, and the agent's start write of the next attempt
/// removes it; a first attempt has no previous one. Passed to the plugin as
/// `run-context.resumed`.
pub fn resumes_interrupted(previous: &bosun_api::node_task::StepStatus) -> bool {
    previous.phase == StepPhase::Pending && previous.attempts > 0 && previous.error.is_none()
}

/// A step found Running that this process is not running and has no result for: the agent
/// restarted during it, or this process's run of it ended without a result.
async fn interrupted(task: &NodeTask, index: usize, agent: &Agent) -> Result<(), Error> {
    let step = &task.spec.steps[index];
    let name = task.name_any();
    let in_flight = InFlight::enter(agent);
    // The plugin that ran it: the step's, or the backend chosen for this node's OS family
    // (chosen again the same way; a refusal now counts as not idempotent).
    let os = crate::facts::host_facts(agent)
        .await
        .map(|f| backends::NodeOs {
            id: f.os.id,
            id_like: f.os.id_like,
        })
        .unwrap_or_default();
    let chosen = match step.plugin.as_deref() {
        Some(named) => choose_backend(agent, &os, named)
            .await
            .ok()
            .map(|c| c.plugin),
        None => None,
    };
    let idempotent = match chosen.as_deref() {
        Some(plugin) => match resolve(&agent.client, &agent.store, &agent.fetcher, plugin).await {
            Ok(r) => {
                let host = agent.host.clone();
                let action = step.action.clone();
                tokio::task::spawn_blocking(move || {
                    host.load(&r.bytes, &r.pin)
                        .map(|l| {
                            l.metadata()
                                .actions
                                .iter()
                                .any(|a| a.name == action && a.idempotent)
                        })
                        .unwrap_or(false)
                })
                .await?
            }
            Err(_) => false,
        },
        None => false,
    };
    drop(in_flight);
    let next = step_transition(StepPhase::Running, StepEvent::AgentRestarted { idempotent })
        .map_err(bosun_cluster::Error::transition(&name))?;
    // The entry keeps the interrupted run's attempt and start time: this manager wrote
    // them when the step started, and server-side apply would drop them if left out.
    let previous = step_status(&task.status.clone().unwrap_or_default().steps, &step.name)
        .cloned()
        .unwrap_or_default();
    let block = if next == StepPhase::Failed {
        let phase = task_transition(NodeTaskPhase::Running, TaskEvent::StepFailed)
            .map_err(bosun_cluster::Error::transition(&name))?;
        Some((phase, Timestamp::now()))
    } else {
        None
    };
    // And the node facts this step's manager wrote (its start write carried `before` if
    // it is the task's first agent step).
    let carried = facts::carried(agent, task, &step_manager(&agent.manager, &step.name));
    let body = TaskStatusWrite::step_interrupted(
        &step.name,
        next,
        previous.attempts,
        previous.started_at.map(|t| t.0),
        block,
    )
    .with_facts(Some(serde_json::Value::Object(carried)));
    tracing::warn!(step = %step.name, idempotent, "found a step interrupted by a restart");
    apply_status(agent, &name, &step.name, &body).await
}

/// Applied with one field manager per step (`<manager>.step.<name>`): server-side apply
/// removes fields a manager set before and omits now, so a manager per step keeps one
/// step's write from deleting another step's entry.
async fn apply_status(
    agent: &Agent,
    name: &str,
    step: &str,
    status: &TaskStatusWrite,
) -> Result<(), Error> {
    bosun_cluster::status::apply(
        &agent.client,
        name,
        &step_manager(&agent.manager, step),
        status,
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod selector_tests {
    use std::collections::BTreeMap;

    use bosun_api::operation::OperationSpec;
    use bosun_planner::NodeInfo;
    use serde_json::json;

    use super::*;

    /// The value a selector term `key=value` of `selector` requires, if any.
    fn required<'a>(selector: &'a str, key: &str) -> Option<&'a str> {
        selector
            .split(',')
            .find_map(|term| term.strip_prefix(key)?.strip_prefix('='))
    }

    /// A 70-character node name (over the 63-character label value limit): the label the
    /// planner puts on the node's task is the value the agent's watch selects.
    #[test]
    fn the_agent_selects_the_label_the_planner_writes_for_a_long_node_name() {
        let node = format!("worker-{}", "a".repeat(63));
        assert_eq!(node.len(), 70);
        let spec: OperationSpec = serde_json::from_value(json!({
            "custom": {"groups": [{"name": "all", "steps": [{"name": "greet", "plugin": "hello", "action": "greet"}]}]}
        }))
        .unwrap();
        let nodes = [NodeInfo {
            name: node.clone(),
            labels: BTreeMap::new(),
            ready: true,
            unschedulable: false,
            cordoned_by: None,
        }];
        let planned = bosun_planner::plan("op", &spec, &nodes, None).unwrap();
        let label = planned.tasks[0].labels[labels::NODE].as_str();
        assert!(
            label.len() <= 63,
            "label value {label:?} is over 63 characters"
        );

        let selector = task_selector(&node, Some("lab-1"));
        assert_eq!(
            required(&selector, labels::NODE),
            Some(label),
            "selector {selector:?}"
        );
        assert_eq!(required(&selector, labels::INSTANCE), Some("lab-1"));

        // A short name is used as it is.
        assert_eq!(
            required(&task_selector("node-1", None), labels::NODE),
            Some("node-1")
        );
    }
}

#[cfg(test)]
mod result_retry_tests {
    use super::*;

    #[test]
    fn a_step_result_is_resent_with_a_doubling_wait_capped_at_the_maximum() {
        let waits: Vec<u64> = (1..=7).map(|n| result_backoff(n).as_secs()).collect();
        assert_eq!(waits, vec![1, 2, 4, 8, 8, 8, 8]);
        assert_eq!(
            result_backoff(u32::MAX),
            RESULT_RETRY_MAX,
            "no overflow however many failures"
        );
    }

    /// A reconcile that keeps failing waits longer each time (5 s doubled up to 60 s, each
    /// ±25 %), and agents that failed together spread out.
    #[test]
    fn a_failing_reconcile_backs_off_with_jitter_up_to_the_maximum() {
        let within = |wait: Duration, base: Duration| wait >= base * 3 / 4 && wait < base * 5 / 4;
        for seed in [1, 42, seed_for("fleet-0001"), seed_for("fleet-0002")] {
            let bases = [5, 10, 20, 40, 60, 60, 60];
            for (failures, base) in (1..).zip(bases) {
                let wait = retry_wait(failures, seed);
                assert!(
                    within(wait, Duration::from_secs(base)),
                    "failure {failures}, seed {seed}: {wait:?} is not within 25 % of {base}s"
                );
            }
            assert!(within(retry_wait(u32::MAX, seed), RETRY_MAX));
        }
        // A thousand agents' first retries do not all land in the same second.
        let seconds: std::collections::BTreeSet<u128> = (0..1000)
            .map(|i| retry_wait(1, seed_for(&format!("fleet-{i:04}"))).as_millis() / 100)
            .collect();
        assert!(
            seconds.len() >= 20,
            "first retries fall in {} tenths of a second",
            seconds.len()
        );
    }

    fn seed_for(node: &str) -> u64 {
        bosun_cluster::watch::seed_of(&format!("{node}/op-{node}"))
    }
}

#[cfg(test)]
mod resumed_tests {
    use bosun_api::node_task::{StepError, StepStatus};

    use super::*;

    /// What the agent reads of a step after its own latest write `agent` (under the step's
    /// agent field manager) and, if a person or the failure policy retried the step, the
    /// controller's retry write over it: that write sets only `phase`, `attempts` and
    /// `message` (under the controller's manager), so the agent's other fields stay.
    fn seen(agent: &TaskStatusWrite, retried: bool) -> StepStatus {
        let mut status = agent.steps[0].to_status();
        if retried {
            status.phase = step_transition(status.phase, StepEvent::Retry).unwrap();
            status.message = Some("recovery Retry (set by a person): runs again".into());
        }
        status
    }

    fn started() -> Timestamp {
        "2026-01-02T03:04:05Z".parse().unwrap()
    }

    #[test]
    fn only_an_attempt_after_an_interrupted_one_is_resumed() {
        // A first attempt.
        assert!(!resumes_interrupted(&StepStatus::default()));

        // Interrupted, idempotent: the agent puts the step back to Pending and runs it again.
        let back = step_transition(
            StepPhase::Running,
            StepEvent::AgentRestarted { idempotent: true },
        )
        .unwrap();
        let idem = TaskStatusWrite::step_interrupted("s", back, 1, Some(started()), None);
        assert!(resumes_interrupted(&seen(&idem, false)));

        // Interrupted, not idempotent: Blocked (Failed, not run), then a person's retry.
        let failed = step_transition(
            StepPhase::Running,
            StepEvent::AgentRestarted { idempotent: false },
        )
        .unwrap();
        let once = TaskStatusWrite::step_interrupted(
            "s",
            failed,
            1,
            Some(started()),
            Some((NodeTaskPhase::Blocked, started())),
        );
        assert!(!resumes_interrupted(&seen(&once, false)));
        assert!(resumes_interrupted(&seen(&once, true)));

        // A recorded result: a failure (then retried) or a success is not an interruption.
        let ended = |phase: StepPhase, error: Option<StepError>| {
            TaskStatusWrite::step_finished(
                StepWrite::finished(
                    "s",
                    2,
                    started(),
                    started(),
                    StepEnd {
                        phase,
                        changed: false,
                        message: "ended".into(),
                        error,
                    },
                    None,
                ),
                None,
            )
        };
        let error = StepError {
            code: "boom".into(),
            message: "failed".into(),
            retryable: true,
        };
        assert!(!resumes_interrupted(&seen(
            &ended(StepPhase::Failed, Some(error)),
            true
        )));
        assert!(!resumes_interrupted(&seen(
            &ended(StepPhase::Succeeded, None),
            false
        )));

        // The start write of the resumed attempt: Running, not resumed again after it.
        let running = TaskStatusWrite::step_started("s", StepPhase::Running, 2, started());
        assert!(!resumes_interrupted(&seen(&running, false)));
    }
}
