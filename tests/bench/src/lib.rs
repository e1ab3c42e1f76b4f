//! Fleet-scale benchmarks of Bosun against the lab's real API server (docs/benchmarks.md).
//!
//! `bosun-bench fleet` registers N fleet nodes in the lab ([`bosun_lab::add_fleet_nodes`]),
//! runs the real `bosun-controller` as a child process and N production agents in this
//! process ([`bosun_agent::fleet`]), then runs a custom Operation (controller cordon, a
//! no-op plugin step, controller uncordon) at each requested `maxUnavailable`. Each run
//! reports the wall time, the API server's own request counts by verb and resource
//! (before/after), the writes per node-step and the writes that changed nothing (writes
//! counted by the API server minus the changes its watches delivered), the controller's
//! CPU time and peak RSS from `/proc`, and at `maxUnavailable: 1` the gap between one
//! node's task finishing and the next one's starting (from the tasks' recorded step
//! times). Then a floor: a plain client loop doing the three writes one node's work needs
//! at the same concurrency against the same API server ([`floor`]).
//!
//! `bosun-bench agent-idle` runs the real `bosun-agent` binary for one node and reads its
//! RSS and CPU over an idle period, then its RSS after it ran a step.
//!
//! Nothing here asserts a time: the smoke test (`tests/fleet_smoke.rs`) checks correctness
//! only.

pub mod ledger;
pub mod metrics;
pub mod procfs;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bosun_agent::fleet::{Fleet, FleetNode, FleetShared};
use bosun_api::node_task::{NodeTask, NodeTaskPhase};
use bosun_api::operation::{Operation, OperationPhase};
use bosun_lab::{FLEET_LABEL, LabHandle, LabNode};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use serde_json::json;

/// The label that scopes Operations and NodeTasks to one controller and its agents.
pub const INSTANCE_LABEL: &str = "bosun.dev/instance";

/// The plugin every fleet step runs: `bosun-test-steps` (`e2e-steps`), action `sleep` for
/// 0 ms (a step that does nothing), published with the grants it declares.
pub const PLUGIN: &str = "e2e-steps";

/// The directory `e2e-steps` declares it writes; every fleet root gets it.
const STEPS_STATE_DIR: &str = "var/lib/bosun-e2e";

/// The no-op step.
fn noop_step() -> serde_json::Value {
    json!({ "name": "noop", "plugin": PLUGIN, "action": "sleep", "params": { "millis": 0 } })
}

/// Gives each fleet root the directory the plugin's grant names.
fn prepare_roots(nodes: &[LabNode]) -> Result<()> {
    for node in nodes {
        let dir = node.host_root.join(STEPS_STATE_DIR);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    Ok(())
}

/// A child process killed (SIGKILL) and reaped when dropped.
pub struct ChildGuard {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
    /// The loopback port of its admin server (`/metrics`), when it was given one.
    pub admin_port: Option<u16>,
}

impl ChildGuard {
    pub fn spawn(name: &str, cmd: &mut Command, dir: &Path) -> Result<ChildGuard> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let log = dir.join(format!("{name}.log"));
        let file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(ChildGuard {
            name: name.into(),
            child,
            log,
            admin_port: None,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails when the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited ({status}); see {}",
                self.name,
                self.log.display()
            );
        }
        Ok(())
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the bench keeps logs and plugin stores: `$CARGO_TARGET_DIR/bench-fleet/<name>`.
pub fn work_dir(name: &str) -> PathBuf {
    bosun_e2e::target_dir().join("bench-fleet").join(name)
}

/// CRDs and the [`PLUGIN`] (built for wasm32-wasip2 if needed). Returns the trust root (public key) file the plugin is signed for.
pub async fn publish(lab: &LabHandle) -> Result<PathBuf> {
    bosun_e2e::apply_crds(&lab.client).await?;
    let wasm = bosun_e2e::build_plugin("bosun-test-steps")?;
    bosun_e2e::publish_plugin(
        &lab.client,
        PLUGIN,
        "0.1.0",
        wasm,
        json!({ "filesystem": [
            { "path": "/etc", "access": "ReadOnly" },
            { "path": format!("/{STEPS_STATE_DIR}"), "access": "ReadWrite" },
        ] }),
    )
    .await?;
    let (_, trust_root) = bosun_e2e::cluster::signing_key()?;
    Ok(trust_root)
}

/// The Cargo profile directory of the binaries the bench runs: its own (`cargo run --release
/// -p bosun-bench` runs the release controller and agent; build them with `cargo build
/// --release --bins` first).
pub const PROFILE: &str = if cfg!(debug_assertions) {
    "debug"
} else {
    "release"
};

/// The namespace of the controller's leader Lease (its default `--lease-namespace`).
pub const LEASE_NAMESPACE: &str = "bosun-system";

/// The name of the leader Lease of the controller of `instance`.
pub fn lease_name(instance: &str) -> String {
    format!("bosun-controller-{instance}")
}

/// Starts the real controller for `instance` (`--resync-seconds` as given; `--identity`
/// when given, else the controller's default, host name and process id); its log is
/// `<name>.log` in `dir`.
pub fn start_controller(
    lab: &LabHandle,
    instance: &str,
    resync_seconds: u64,
    identity: Option<&str>,
    name: &str,
    dir: &Path,
) -> Result<ChildGuard> {
    // Its admin server on a free loopback port, for its `bosun_watch_lists_total`.
    let admin_port = bosun_e2e::admin::free_port()
        .context("finding a free port for the controller's admin server")?;
    let mut cmd = Command::new(bosun_e2e::binary_of(PROFILE, "bosun-controller")?);
    cmd.env("KUBECONFIG", &lab.kubeconfig)
        .env("BOSUN_LOG", "warn")
        .arg("--admin-addr")
        .arg(format!("127.0.0.1:{admin_port}"))
        .arg("--instance")
        .arg(instance)
        .args(["--resync-seconds", &resync_seconds.to_string()]);
    if let Some(identity) = identity {
        cmd.args(["--identity", identity]);
    }
    cmd
        // A longer lease than the default 15 s: on this shared 2-core machine, with a
        // thousand agents starting their watches, a renewal once took over 10 s to answer
        // and the controller stopped (as it must when it loses the lease).
        .args([
            "--lease-duration-seconds",
            "60",
            "--lease-renew-seconds",
            "10",
        ]);
    let mut guard = ChildGuard::spawn(name, &mut cmd, dir)?;
    guard.admin_port = Some(admin_port);
    Ok(guard)
}

/// `bosun_watch_lists_total` of this process (the fleet's agents) by resource.
pub fn agent_watch_lists() -> BTreeMap<String, u64> {
    parse_watch_lists(&bosun_telemetry::metrics().encode())
}

/// `bosun_watch_lists_total` by resource from the admin server on loopback `port`: the full
/// lists that process's watches made since it started.
pub fn watch_lists_of(port: u16) -> Result<BTreeMap<String, u64>> {
    let (code, text) = bosun_e2e::admin::get(port, "/metrics")
        .with_context(|| format!("reading 127.0.0.1:{port}/metrics"))?;
    ensure!(code == 200, "127.0.0.1:{port}/metrics answered {code}");
    Ok(parse_watch_lists(&text))
}

/// The `bosun_watch_lists_total{resource="..."} N` lines of a metrics text.
pub fn parse_watch_lists(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("bosun_watch_lists_total{resource=\"")?;
            let (resource, rest) = rest.split_once("\"}")?;
            Some((resource.to_string(), rest.trim().parse().ok()?))
        })
        .collect()
}

/// The N fleet nodes, the controller and the in-process agents, ready for runs.
pub struct FleetEnv {
    pub lab: LabHandle,
    pub prefix: String,
    pub nodes: Vec<LabNode>,
    pub instance: String,
    pub controller: ChildGuard,
    pub fleet: Fleet,
    pub dir: PathBuf,
    pub resync_seconds: u64,
    /// The `--identity` the controller runs with (`None`: its default, which differs
    /// per process).
    pub controller_identity: Option<String>,
    /// Controller processes started so far (names the logs of restarted ones).
    pub controller_starts: u32,
    /// This process's RSS before the agents started and once their watches were open.
    pub rss_before_kib: u64,
    pub rss_watching_kib: u64,
    /// NodeTask watches the API server had open before the controller and the agents
    /// started, and the agents' watches opened since (the controller's one not counted).
    pub watches_before: f64,
    pub watches_open: f64,
    /// How long adding the fleet Nodes took.
    pub nodes_added_in: Duration,
}

/// What [`FleetEnv::start`] needs.
#[derive(Clone, Debug)]
pub struct FleetOptions {
    pub nodes: u32,
    pub prefix: String,
    pub resync_seconds: u64,
    /// Run the controller with a fixed `--identity` (so that a restarted one holds the
    /// Lease it held, as a container restarted in its pod does), not its per-process
    /// default.
    pub fixed_identity: bool,
}

impl FleetEnv {
    /// Adds the fleet nodes, starts the controller and the agents, and waits until the API
    /// server has every agent's NodeTask watch open.
    pub async fn start(lab: LabHandle, opts: &FleetOptions) -> Result<FleetEnv> {
        let lab_for_cleanup = bosun_lab::running(&lab.state_dir).await?;
        match FleetEnv::start_inner(lab, opts).await {
            Ok(env) => Ok(env),
            Err(e) => {
                // Fleet nodes left behind would be selected by other Operations.
                let _ = bosun_lab::remove_fleet_nodes(&lab_for_cleanup, &opts.prefix).await;
                Err(e)
            }
        }
    }

    async fn start_inner(lab: LabHandle, opts: &FleetOptions) -> Result<FleetEnv> {
        let instance = bosun_e2e::unique("fleet");
        let dir = work_dir(&instance);
        let trust_root = publish(&lab).await?;
        // Leftovers of an interrupted run would be selected too.
        bosun_lab::remove_fleet_nodes(&lab, &opts.prefix).await?;
        let t = Instant::now();
        let nodes = bosun_lab::add_fleet_nodes(&lab, &opts.prefix, opts.nodes).await?;
        prepare_roots(&nodes)?;
        let nodes_added_in = t.elapsed();
        // Before the controller starts: its own NodeTask watch is one of those counted.
        let watches_before = metrics::scrape(&lab.client).await?.watches("nodetasks");
        let controller_identity = opts
            .fixed_identity
            .then(|| format!("bosun-bench-{instance}"));
        let controller = start_controller(
            &lab,
            &instance,
            opts.resync_seconds,
            controller_identity.as_deref(),
            "controller",
            &dir,
        )?;

        let roots =
            bosun_trust::TrustRoots::load([&trust_root]).context("loading the trust root")?;
        let base_root = dir.join("root");
        std::fs::create_dir_all(&base_root)?;
        let mut config = bosun_host::HostConfig::new(&base_root, roots);
        // One pool for every agent (an agent process has its own, of 16): as many slots as
        // agents, so a step never finds the pool full (slots are address space until used).
        config.pool.max_instances = opts.nodes.clamp(16, 1024);
        let host = bosun_host::Host::new(config).context("starting the plugin host")?;
        let shared = FleetShared {
            client: lab.client.clone(),
            host: Arc::new(host),
            store: bosun_agent::plugins::Store::new(dir.join("plugins"))?,
            fetcher: bosun_fetch::Fetcher::new(&bosun_fetch::FetchConfig::default())?,
            instance: Some(instance.clone()),
            min_free_bytes: 1024 * 1024 * 1024,
        };
        let fleet_nodes: Vec<FleetNode> = nodes
            .iter()
            .map(|n| FleetNode {
                name: n.name.clone(),
                host_root: n.host_root.clone(),
            })
            .collect();
        let rss_before_kib = procfs::own()?.rss_kib;
        let fleet = Fleet::start(&shared, &fleet_nodes)?;
        let mut env = FleetEnv {
            lab,
            prefix: opts.prefix.clone(),
            nodes,
            instance,
            controller,
            fleet,
            dir,
            resync_seconds: opts.resync_seconds,
            controller_identity,
            controller_starts: 1,
            rss_before_kib,
            rss_watching_kib: 0,
            watches_before,
            watches_open: 0.0,
            nodes_added_in,
        };
        // The agents' watches and the controller's.
        let want = watches_before + f64::from(opts.nodes) + 1.0;
        let deadline = Instant::now() + Duration::from_secs(120 + u64::from(opts.nodes) / 5);
        loop {
            env.controller.check_alive()?;
            let open = metrics::scrape(&env.lab.client).await?.watches("nodetasks");
            if open >= want {
                env.watches_open = open - watches_before - 1.0;
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "only {} of {} agents' NodeTask watches (and the controller's) opened",
                    open - watches_before,
                    opts.nodes
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        env.rss_watching_kib = procfs::own()?.rss_kib;
        Ok(env)
    }

    /// Stops the agents and the controller, and removes the fleet nodes.
    pub async fn finish(self) -> Result<()> {
        let FleetEnv {
            lab,
            prefix,
            fleet,
            controller,
            instance,
            ..
        } = self;
        fleet.stop().await;
        drop(controller);
        delete_instance(&lab.client, &instance).await?;
        bosun_lab::remove_fleet_nodes(&lab, &prefix).await?;
        Ok(())
    }
}

/// Deletes the Operations of `instance` and waits until their NodeTasks are gone.
pub async fn delete_instance(client: &Client, instance: &str) -> Result<()> {
    let selector = format!("{INSTANCE_LABEL}={instance}");
    let ops: Api<Operation> = Api::all(client.clone());
    ops.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels(&selector),
    )
    .await
    .context("deleting the bench's Operations")?;
    let tasks: Api<NodeTask> = Api::all(client.clone());
    // The garbage collector removes the tasks; deleting them here too is quicker at scale.
    tasks
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&selector),
        )
        .await
        .context("deleting the bench's NodeTasks")?;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let left = tasks
            .list_metadata(&ListParams::default().labels(&selector).limit(1))
            .await?;
        if left.items.is_empty() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "NodeTasks of {instance} still there after 300s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Changes one watch delivered (each is one write that changed the object).
#[derive(Clone, Default)]
pub struct EventCount {
    pub changes: Arc<AtomicU64>,
    pub ready: Arc<AtomicBool>,
    /// The watch listed again after its first list (its counts are then not exact).
    pub relisted: Arc<AtomicBool>,
}

impl EventCount {
    /// Counts the changes of `api`'s objects matching `selector` until dropped (abort the
    /// returned task).
    pub fn spawn<K>(api: Api<K>, selector: String) -> (EventCount, tokio::task::JoinHandle<()>)
    where
        K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    {
        EventCount::spawn_with(api, selector, |_| {})
    }

    /// As [`EventCount::spawn`], and gives every object the watch delivers (listed or
    /// changed) to `seen`.
    pub fn spawn_with<K, F>(
        api: Api<K>,
        selector: String,
        mut seen: F,
    ) -> (EventCount, tokio::task::JoinHandle<()>)
    where
        K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
        F: FnMut(&K) + Send + 'static,
    {
        let count = EventCount::default();
        let c = count.clone();
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default().labels(&selector)).boxed();
            let mut inits = 0;
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::Init) => {
                        inits += 1;
                        if inits > 1 {
                            c.relisted.store(true, Ordering::SeqCst);
                        }
                    }
                    Ok(watcher::Event::InitApply(obj)) => seen(&obj),
                    Ok(watcher::Event::InitDone) => c.ready.store(true, Ordering::SeqCst),
                    Ok(watcher::Event::Apply(obj)) => {
                        seen(&obj);
                        c.changes.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(watcher::Event::Delete(_)) => {
                        c.changes.fetch_add(1, Ordering::SeqCst);
                    }
                    _ => {}
                }
            }
        });
        (count, task)
    }

    pub fn get(&self) -> u64 {
        self.changes.load(Ordering::SeqCst)
    }
}

/// Percentiles (nearest rank) of durations, in milliseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spread {
    pub count: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Spread {
    pub fn of(mut ms: Vec<f64>) -> Spread {
        if ms.is_empty() {
            return Spread::default();
        }
        ms.sort_by(f64::total_cmp);
        let rank = |p: f64| ms[((p * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
        Spread {
            count: ms.len(),
            p50_ms: rank(0.50),
            p99_ms: rank(0.99),
            max_ms: ms[ms.len() - 1],
        }
    }
}

/// One Operation over the fleet at one `maxUnavailable`.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    pub max_unavailable: String,
    /// The parallelism the plan froze.
    pub parallel: u32,
    pub nodes: usize,
    pub wall: Duration,
    /// Request counts during the run, by (verb, resource, subresource).
    pub requests: BTreeMap<metrics::Key, f64>,
    /// The API server's seconds serving them (a WATCH: while it was open), same keys.
    pub server_seconds: BTreeMap<metrics::Key, f64>,
    /// Watches the API server's watch cache closed because the client fell behind, by
    /// resource.
    pub terminated_watchers: BTreeMap<String, f64>,
    /// Seconds requests waited in API Priority and Fairness queues, by priority level.
    pub queue_wait: BTreeMap<String, f64>,
    /// Writes by resource during the run.
    pub writes: BTreeMap<String, f64>,
    /// Node-steps run (nodes × steps).
    pub node_steps: usize,
    /// Changes delivered by the bench's watches, by resource.
    pub changes: BTreeMap<String, u64>,
    /// Whether a bench watch relisted (change counts approximate).
    pub relisted: bool,
    /// Operation GETs the bench itself made while waiting (in `requests`).
    pub own_gets: u64,
    pub controller_cpu_secs: f64,
    /// CPU seconds during the run of the other processes on the machine's cores: the lab's
    /// etcd, kube-apiserver and kube-controller-manager, and this process (the fleet's
    /// agents and the bench's own watches). Where the cores went.
    pub cpu_secs: Vec<(String, f64)>,
    pub controller_hwm_kib: u64,
    pub controller_rss_kib: u64,
    /// Full lists made by the controller's watches since it (the last one, after a
    /// restart) started, by resource (`bosun_watch_lists_total`): one per watch is its
    /// first list, any more are relists.
    pub controller_watch_lists: BTreeMap<String, u64>,
    /// The same for the fleet's agents together, since they started.
    pub agent_watch_lists: BTreeMap<String, u64>,
    /// Between one task's last step finishing and the next task's first step starting,
    /// in start order (only with parallelism 1).
    pub gaps: Option<Spread>,
    /// Where the tasks' time went ([`phases_ms`]).
    pub phases: Vec<(String, Spread)>,
    /// Every task Succeeded.
    pub all_succeeded: bool,
    /// Whether a step ran twice or a task was created twice (a failed run unless
    /// [`ledger::OnceCheck::passed`]).
    pub once: ledger::OnceCheck,
    /// The controller killed and started again mid-run, when asked for.
    pub restart: Option<RestartResult>,
    pub floor: Option<FloorResult>,
    /// The floor of the design's writes ([`run_design_floor`]), run after `floor`.
    pub design_floor: Option<FloorResult>,
}

/// Kill the controller (SIGKILL, as a crash) once `at_percent` % of the Operation's tasks
/// have Succeeded, and start it again with the same binary and arguments.
#[derive(Clone, Copy, Debug)]
pub struct RestartPlan {
    pub at_percent: u32,
}

/// `50%` or `50`: a percentage from 1 to 99.
pub fn parse_percent(s: &str) -> Result<u32> {
    let p: u32 = s
        .strip_suffix('%')
        .unwrap_or(s)
        .parse()
        .with_context(|| format!("{s}: a percentage such as 50%"))?;
    ensure!(
        (1..=99).contains(&p),
        "{s}: the percentage must be from 1 to 99 (the Operation must still be running)"
    );
    Ok(p)
}

/// How many of `nodes` tasks must have Succeeded for `percent` % (rounded up, at least 1).
pub fn restart_threshold(nodes: usize, percent: u32) -> usize {
    (nodes * percent as usize).div_ceil(100).max(1)
}

/// What a controller restart during a run took. Times are wall-clock (the bench, the
/// controller and the API server share this machine's clock).
#[derive(Clone, Debug)]
pub struct RestartResult {
    /// Tasks Succeeded when the controller was killed, and the threshold asked for.
    pub succeeded_at_kill: usize,
    pub threshold: usize,
    pub total: usize,
    /// The Lease's holder before the kill, and once the new process led.
    pub old_holder: Option<String>,
    pub new_holder: Option<String>,
    /// The old process reaped after SIGKILL.
    pub killed_at: Timestamp,
    /// The new process spawned.
    pub started_at: Timestamp,
    /// The new process became leader: the `acquireTime` it wrote when it took the Lease
    /// from the killed process (or, with the same identity, which keeps the acquire time,
    /// the `renewTime` of its first renewal).
    pub leader_at: Option<Timestamp>,
    /// The first NodeTask change by the controller the bench's watch saw after
    /// `leader_at`: the resume.
    pub resumed_at: Option<Timestamp>,
    /// Lease GETs the bench made waiting for the new leader (in the request counts).
    pub lease_gets: u64,
}

/// Seconds from `a` to `b`.
fn secs_between(a: Timestamp, b: Timestamp) -> f64 {
    (b.as_microsecond() - a.as_microsecond()) as f64 / 1e6
}

impl RestartResult {
    /// New process start → leader (the Lease wait).
    pub fn start_to_leader_secs(&self) -> Option<f64> {
        Some(secs_between(self.started_at, self.leader_at?))
    }
    /// Leader → first NodeTask write (the resume).
    pub fn leader_to_resume_secs(&self) -> Option<f64> {
        Some(secs_between(self.leader_at?, self.resumed_at?))
    }
    /// New process start → first NodeTask write.
    pub fn start_to_resume_secs(&self) -> Option<f64> {
        Some(secs_between(self.started_at, self.resumed_at?))
    }
}

fn lock(ledger: &Mutex<ledger::Ledger>) -> std::sync::MutexGuard<'_, ledger::Ledger> {
    ledger
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Kills the controller (SIGKILL) and starts it again with the same arguments; returns
/// the old process's last reading.
async fn restart_controller(
    env: &mut FleetEnv,
    succeeded: usize,
    threshold: usize,
) -> Result<(RestartResult, procfs::ProcSample)> {
    let leases: Api<Lease> = Api::namespaced(env.lab.client.clone(), LEASE_NAMESPACE);
    let old_holder = leases
        .get_opt(&lease_name(&env.instance))
        .await?
        .and_then(|l| l.spec?.holder_identity);
    let last = procfs::sample(env.controller.pid())?;
    env.controller
        .child
        .kill()
        .context("killing the controller")?;
    env.controller.child.wait()?;
    let killed_at = Timestamp::now();
    env.controller_starts += 1;
    let started_at = Timestamp::now();
    env.controller = start_controller(
        &env.lab,
        &env.instance,
        env.resync_seconds,
        env.controller_identity.as_deref(),
        &format!("controller-{}", env.controller_starts),
        &env.dir,
    )?;
    Ok((
        RestartResult {
            succeeded_at_kill: succeeded,
            threshold,
            total: env.nodes.len(),
            old_holder,
            new_holder: None,
            killed_at,
            started_at,
            leader_at: None,
            resumed_at: None,
            lease_gets: 0,
        },
        last,
    ))
}

/// Reads the Lease once: whether the new controller has written it since it started.
async fn poll_leader(client: &Client, instance: &str, r: &mut RestartResult) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    r.lease_gets += 1;
    let Some(spec) = leases
        .get_opt(&lease_name(instance))
        .await?
        .and_then(|l| l.spec)
    else {
        return Ok(());
    };
    if spec.holder_identity.as_deref().is_none_or(str::is_empty) {
        return Ok(());
    }
    // Taken from another holder: its acquire time. Renewed by the same identity (which
    // keeps the acquire time): its first renewal since it started.
    let acquired = spec.acquire_time.map(|t| t.0);
    let renewed = spec.renew_time.map(|t| t.0);
    if let Some(at) = [acquired, renewed]
        .into_iter()
        .flatten()
        .find(|t| *t >= r.started_at)
    {
        r.leader_at = Some(at);
        r.new_holder = spec.holder_identity;
    }
    Ok(())
}

impl RunResult {
    /// Writes to `resource` that changed nothing: counted by the API server, not delivered
    /// as a change by the watch (negative would mean the watch saw changes the counter
    /// missed: clamped to 0).
    pub fn no_op_writes(&self, resource: &str) -> f64 {
        let writes = self.writes.get(resource).copied().unwrap_or(0.0);
        let changes = self.changes.get(resource).copied().unwrap_or(0) as f64;
        (writes - changes).max(0.0)
    }

    /// Writes of Bosun's resources (NodeTasks, Operations, Nodes, Events) per node-step.
    pub fn bosun_writes(&self) -> f64 {
        ["nodetasks", "operations", "nodes", "events"]
            .iter()
            .map(|r| self.writes.get(*r).copied().unwrap_or(0.0))
            .sum()
    }
}

/// The custom Operation of a run: cordon (controller), the no-op plugin step, uncordon.
pub fn operation(
    name: &str,
    instance: &str,
    prefix: &str,
    max_unavailable: &str,
) -> Result<serde_json::Value> {
    let mu = match max_unavailable.strip_suffix('%') {
        Some(p) => {
            let _: u32 = p.parse().with_context(|| {
                format!("--max-unavailable {max_unavailable}: a whole number or a percentage such as 10%")
            })?;
            json!(max_unavailable)
        }
        None => json!(max_unavailable.parse::<u32>().with_context(|| {
            format!(
                "--max-unavailable {max_unavailable}: a whole number or a percentage such as 10%"
            )
        })?),
    };
    Ok(json!({
        "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation",
        "metadata": { "name": name, "labels": { INSTANCE_LABEL: instance } },
        "spec": {
            "custom": { "groups": [{
                "name": "fleet",
                "nodeSelector": { "matchLabels": { FLEET_LABEL: bosun_lab::fleet::fleet_label_value(prefix) } },
                "steps": [
                    { "name": "cordon", "runsOn": "controller", "action": "cordon" },
                    noop_step(),
                    { "name": "uncordon", "runsOn": "controller", "action": "uncordon" },
                ],
            }]},
            "rollout": { "maxUnavailable": mu },
        },
    }))
}

/// Runs the fleet Operation at `max_unavailable` and measures it; then the floor at the
/// same parallelism when `floor` is set.
/// With `restart`, kills the controller mid-run and starts it again ([`RestartPlan`]).
pub async fn run_once(
    env: &mut FleetEnv,
    max_unavailable: &str,
    floor: bool,
    restart: Option<RestartPlan>,
) -> Result<RunResult> {
    let client = env.lab.client.clone();
    let instance_sel = format!("{INSTANCE_LABEL}={}", env.instance);
    let ledger = Arc::new(Mutex::new(ledger::Ledger::default()));
    let seen = ledger.clone();
    let (tasks_seen, t1) = EventCount::spawn_with(
        Api::<NodeTask>::all(client.clone()),
        instance_sel.clone(),
        move |t: &NodeTask| lock(&seen).observe(t, Timestamp::now()),
    );
    let (ops_seen, t2) =
        EventCount::spawn(Api::<Operation>::all(client.clone()), instance_sel.clone());
    let fleet_sel = format!(
        "{FLEET_LABEL}={}",
        bosun_lab::fleet::fleet_label_value(&env.prefix)
    );
    let (nodes_seen, t3) = EventCount::spawn(Api::<Node>::all(client.clone()), fleet_sel);
    let watchers = [t1, t2, t3];
    let all = [&tasks_seen, &ops_seen, &nodes_seen];
    let deadline = Instant::now() + Duration::from_secs(60);
    while !all.iter().all(|c| c.ready.load(Ordering::SeqCst)) {
        ensure!(
            Instant::now() < deadline,
            "the bench's own watches did not list in 60s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let base = [tasks_seen.get(), ops_seen.get(), nodes_seen.get()];

    let name = bosun_e2e::unique(&format!("fleet-{}", max_unavailable.replace('%', "pct")));
    let ops: Api<Operation> = Api::all(client.clone());
    let ctl_before = procfs::sample(env.controller.pid())?;
    let cpu_before = cpu_by_process(&env.lab.state_dir);
    let before = metrics::scrape(&client).await?;
    let started = Instant::now();
    ops.create(
        &PostParams::default(),
        &serde_json::from_value(operation(
            &name,
            &env.instance,
            &env.prefix,
            max_unavailable,
        )?)?,
    )
    .await
    .with_context(|| format!("creating Operation {name}"))?;
    let mut own_gets = 0;
    let mut restarted: Option<(RestartResult, procfs::ProcSample)> = None;
    // The Lease is read once a second until the new leader shows (the time comes from
    // the Lease itself, not from when it was read).
    let mut last_lease_poll: Option<Instant> = None;
    let limit = Duration::from_secs(300 + 3 * env.nodes.len() as u64);
    let op = loop {
        env.controller.check_alive()?;
        ensure!(env.fleet.all_running(), "an agent of the fleet stopped");
        if let Some(plan) = restart
            && restarted.is_none()
        {
            let threshold = restart_threshold(env.nodes.len(), plan.at_percent);
            let succeeded = lock(&ledger).succeeded(&name);
            if succeeded >= threshold {
                restarted = Some(restart_controller(env, succeeded, threshold).await?);
            }
        }
        if let Some((r, _)) = restarted.as_mut()
            && r.leader_at.is_none()
            && last_lease_poll.is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            last_lease_poll = Some(Instant::now());
            poll_leader(&client, &env.instance, r).await?;
        }
        let op = ops.get(&name).await?;
        own_gets += 1;
        let phase = op.status.as_ref().map(|s| s.phase).unwrap_or_default();
        if phase == OperationPhase::Succeeded {
            ensure!(
                restart.is_none() || restarted.is_some(),
                "Operation {name} Succeeded before the controller was restarted"
            );
            break op;
        }
        if matches!(phase, OperationPhase::Failed | OperationPhase::Blocked)
            || started.elapsed() > limit
        {
            bail!(
                "Operation {name} is {phase:?} after {:?}:\n{}",
                started.elapsed(),
                bosun_e2e::describe_tasks(&client, &name).await
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let wall = started.elapsed();
    // Let the last writes' events arrive before reading the counters.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = metrics::scrape(&client).await?;
    let cpu_secs = cpu_since(&cpu_before, &cpu_by_process(&env.lab.state_dir));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ctl_after = procfs::sample(env.controller.pid())?;
    let controller_watch_lists = match env.controller.admin_port {
        Some(port) => watch_lists_of(port)?,
        None => BTreeMap::new(),
    };
    // After a restart: the old process's share up to the kill, and the new one's whole.
    let (controller_cpu_secs, controller_hwm_kib) = match &restarted {
        Some((_, old)) => (
            old.cpu_secs - ctl_before.cpu_secs + ctl_after.cpu_secs,
            old.hwm_kib.max(ctl_after.hwm_kib),
        ),
        None => (ctl_after.cpu_secs - ctl_before.cpu_secs, ctl_after.hwm_kib),
    };
    let changes = BTreeMap::from([
        ("nodetasks".to_string(), tasks_seen.get() - base[0]),
        ("operations".to_string(), ops_seen.get() - base[1]),
        ("nodes".to_string(), nodes_seen.get() - base[2]),
    ]);
    let relisted = all.iter().any(|c| c.relisted.load(Ordering::SeqCst));
    for w in watchers {
        w.abort();
    }
    let requests = metrics::delta(&after.requests, &before.requests);
    let writes = metrics::writes_by_resource(&requests);
    let server_seconds = metrics::delta(&after.seconds, &before.seconds);
    let terminated_watchers =
        metrics::delta(&after.terminated_watchers, &before.terminated_watchers);
    let queue_wait = metrics::delta(&after.queue_wait, &before.queue_wait);

    let tasks: Api<NodeTask> = Api::all(client.clone());
    let list = tasks
        .list(&ListParams::default().labels(&format!("bosun.dev/operation={name}")))
        .await?;
    let all_succeeded = list.items.len() == env.nodes.len()
        && list.items.iter().all(|t| {
            t.status
                .as_ref()
                .is_some_and(|s| s.phase == NodeTaskPhase::Succeeded)
        });
    let parallel = op
        .status
        .as_ref()
        .and_then(|s| s.plan.as_ref())
        .and_then(|p| p.groups.first())
        .map_or(0, |g| g.max_parallel);
    let once = lock(&ledger).check(&name, &list.items);
    let restart = match restarted {
        Some((mut r, _)) => {
            if r.leader_at.is_none() {
                poll_leader(&client, &env.instance, &mut r).await?;
            }
            r.resumed_at = r
                .leader_at
                .and_then(|at| lock(&ledger).first_controller_write_after(at));
            Some(r)
        }
        None => None,
    };
    let steps_per_task = 3;
    let gaps = (parallel == 1).then(|| Spread::of(gaps_ms(&list.items)));
    let phases = phases_ms(&list.items);
    let mut result = RunResult {
        max_unavailable: max_unavailable.into(),
        parallel,
        nodes: env.nodes.len(),
        wall,
        requests,
        server_seconds,
        terminated_watchers,
        queue_wait,
        writes,
        node_steps: env.nodes.len() * steps_per_task,
        changes,
        relisted,
        own_gets,
        controller_cpu_secs,
        cpu_secs,
        controller_hwm_kib,
        controller_rss_kib: ctl_after.rss_kib,
        controller_watch_lists,
        agent_watch_lists: agent_watch_lists(),
        gaps,
        phases,
        all_succeeded,
        once,
        restart,
        floor: None,
        design_floor: None,
    };
    // The next run's tasks would wait for these nodes while these tasks exist.
    delete_instance(&client, &env.instance).await?;
    if floor {
        let names: Vec<String> = env.nodes.iter().map(|n| n.name.clone()).collect();
        let parallel = parallel.max(1) as usize;
        let state_dir = &env.lab.state_dir;
        let cpu = cpu_by_process(state_dir);
        let mut minimum = run_floor(&client, &names, parallel).await?;
        minimum.cpu_secs = cpu_since(&cpu, &cpu_by_process(state_dir));
        result.floor = Some(minimum);
        let cpu = cpu_by_process(state_dir);
        let mut design = run_design_floor(&client, &names, parallel).await?;
        design.cpu_secs = cpu_since(&cpu, &cpu_by_process(state_dir));
        result.design_floor = Some(design);
    }
    Ok(result)
}

/// Start-to-finish gaps between consecutive tasks (start = first step's start, finish =
/// last step's finish), in start order, in milliseconds.
pub fn gaps_ms(tasks: &[NodeTask]) -> Vec<f64> {
    let mut spans: Vec<(i64, i64)> = tasks
        .iter()
        .filter_map(|t| {
            let steps = &t.status.as_ref()?.steps;
            let start = steps
                .iter()
                .filter_map(|s| s.started_at.as_ref())
                .map(|t| t.0.as_microsecond())
                .min()?;
            let end = steps
                .iter()
                .filter_map(|s| s.finished_at.as_ref())
                .map(|t| t.0.as_microsecond())
                .max()?;
            Some((start, end))
        })
        .collect();
    spans.sort_unstable();
    spans
        .windows(2)
        .map(|w| (w[1].0 - w[0].1) as f64 / 1000.0)
        .collect()
}

/// Where the tasks' time went, from their recorded step times: for each step (in the
/// tasks' order) how long it ran, and between consecutive steps how long the next one took
/// to start (the hand-over between controller and agent: a status write, a watch event, a
/// reconcile, the step gate's reads); and first, when each task's first step started,
/// counted from the earliest (how long starting every task took).
pub fn phases_ms(tasks: &[NodeTask]) -> Vec<(String, Spread)> {
    let Some(first) = tasks.first() else {
        return Vec::new();
    };
    let names: Vec<&str> = first.spec.steps.iter().map(|s| s.name.as_str()).collect();
    let times = |t: &NodeTask, name: &str| -> Option<(i64, i64)> {
        let step = t.status.as_ref()?.steps.iter().find(|s| s.name == name)?;
        Some((
            step.started_at.as_ref()?.0.as_microsecond(),
            step.finished_at.as_ref()?.0.as_microsecond(),
        ))
    };
    let ms = |us: i64| us as f64 / 1000.0;
    let mut out = Vec::new();
    let starts: Vec<i64> = tasks
        .iter()
        .filter_map(|t| times(t, names.first()?).map(|(s, _)| s))
        .collect();
    if let Some(earliest) = starts.iter().min() {
        out.push((
            format!("{} started, after the earliest task's", names[0]),
            Spread::of(starts.iter().map(|s| ms(s - earliest)).collect()),
        ));
    }
    for (i, name) in names.iter().enumerate() {
        out.push((
            format!("{name} ran"),
            Spread::of(
                tasks
                    .iter()
                    .filter_map(|t| times(t, name).map(|(s, f)| ms(f - s)))
                    .collect(),
            ),
        ));
        if let Some(next) = names.get(i + 1) {
            out.push((
                format!("{name} finished -> {next} started"),
                Spread::of(
                    tasks
                        .iter()
                        .filter_map(|t| Some(ms(times(t, next)?.0 - times(t, name)?.1)))
                        .collect(),
                ),
            ));
        }
    }
    out
}

/// The floor: what the API server takes for the minimum writes of one node's work.
#[derive(Clone, Debug, Default)]
pub struct FloorResult {
    pub parallel: usize,
    pub wall: Duration,
    pub writes: f64,
    /// CPU seconds of the lab's daemons and of this process while it ran (this process: the
    /// floor's client, and the fleet's idle agents).
    pub cpu_secs: Vec<(String, f64)>,
}

/// For each node, at `parallel` nodes at a time: create a NodeTask (labelled with an
/// instance no controller or agent acts on), write its step Running, write its result.
/// Then deletes the tasks (not timed).
pub async fn run_floor(client: &Client, nodes: &[String], parallel: usize) -> Result<FloorResult> {
    floor_loop(client, nodes, parallel, false).await
}

/// The floor of the design's writes: for each node, at `parallel` nodes at a time, exactly
/// the writes Bosun's run makes for it, with merge patches and nothing else (no read, no
/// watch, no decision): create the task (cordon, no-op, uncordon); cordon the Node, then
/// write the task started with its cordon done; write the no-op step Running, then its
/// result; uncordon the Node, then write the uncordon and the task Succeeded. Five NodeTask
/// writes and two Node writes, as the run's (the Node writes bring kube-controller-manager's
/// taint patches here too). What the run takes beyond this is Bosun's orchestration (and the
/// agents' and the controller's CPU on the same cores); what this takes beyond [`run_floor`]
/// is the work of the steps themselves.
pub async fn run_design_floor(
    client: &Client,
    nodes: &[String],
    parallel: usize,
) -> Result<FloorResult> {
    floor_loop(client, nodes, parallel, true).await
}

/// The floors' loop: with `node_steps`, [`run_design_floor`]'s writes, else
/// [`run_floor`]'s.
async fn floor_loop(
    client: &Client,
    nodes: &[String],
    parallel: usize,
    node_steps: bool,
) -> Result<FloorResult> {
    let instance = bosun_e2e::unique("floor");
    let api: Api<NodeTask> = Api::all(client.clone());
    let node_api: Api<Node> = Api::all(client.clone());
    let before = metrics::scrape(client).await?;
    let started = Instant::now();
    futures::stream::iter(nodes.iter().map(|node| {
        let (api, node_api) = (api.clone(), node_api.clone());
        let instance = instance.clone();
        async move {
            let name = format!("{instance}-{node}");
            let steps = if node_steps {
                json!([{ "name": "cordon", "runsOn": "controller", "action": "cordon" }, noop_step(),
                       { "name": "uncordon", "runsOn": "controller", "action": "uncordon" }])
            } else {
                json!([noop_step()])
            };
            let task: NodeTask = serde_json::from_value(json!({
                "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeTask",
                "metadata": { "name": name, "labels": { INSTANCE_LABEL: instance } },
                "spec": { "operation": instance, "nodeName": node, "group": "fleet",
                          "steps": steps },
            }))?;
            api.create(&PostParams::default(), &task).await?;
            let now = || k8s_openapi::jiff::Timestamp::now().to_string();
            let status = |body: serde_json::Value| {
                let api = api.clone();
                let name = name.clone();
                async move {
                    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({ "status": body })))
                        .await
                }
            };
            let unschedulable = |value: bool| {
                let node_api = node_api.clone();
                async move {
                    node_api
                        .patch(node, &PatchParams::default(), &Patch::Merge(json!({ "spec": { "unschedulable": value } })))
                        .await
                }
            };
            // A finished step's status entry.
            let done = |step: &str, started_at: &str| {
                json!({ "name": step, "phase": "Succeeded", "attempts": 1,
                        "startedAt": started_at, "finishedAt": now() })
            };
            let mut steps = Vec::new();
            if node_steps {
                let at = now();
                unschedulable(true).await?;
                steps.push(done("cordon", &at));
                status(json!({ "phase": "Running", "attempts": 1, "steps": steps })).await?;
            }
            let started_at = now();
            let mut running = steps.clone();
            running.push(json!({ "name": "noop", "phase": "Running", "attempts": 1, "startedAt": started_at }));
            status(json!({ "phase": "Running", "currentStep": "noop", "steps": running })).await?;
            steps.push(done("noop", &started_at));
            if node_steps {
                status(json!({ "steps": steps })).await?;
                let at = now();
                unschedulable(false).await?;
                steps.push(done("uncordon", &at));
            }
            status(json!({ "phase": "Succeeded", "steps": steps })).await?;
            anyhow::Ok(())
        }
    }))
    .buffer_unordered(parallel)
    .try_collect::<Vec<()>>()
    .await?;
    let wall = started.elapsed();
    let after = metrics::scrape(client).await?;
    // Only the floor's own verbs: the garbage collector may still be deleting the tasks
    // of the run before (and kube-controller-manager's Node writes are not the floor's).
    let writes = metrics::delta(&after.requests, &before.requests)
        .iter()
        .filter(|((verb, resource, _), _)| {
            (resource == "nodetasks" && (verb == "POST" || verb == "PATCH"))
                || (node_steps && resource == "nodes" && verb == "PATCH")
        })
        .map(|(_, n)| n)
        .sum();
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels(&format!("{INSTANCE_LABEL}={instance}")),
    )
    .await?;
    Ok(FloorResult {
        parallel,
        wall,
        writes,
        cpu_secs: Vec::new(),
    })
}

/// CPU seconds used between two [`cpu_by_process`] samples, by name.
fn cpu_since(before: &[(String, f64)], after: &[(String, f64)]) -> Vec<(String, f64)> {
    after
        .iter()
        .map(|(name, a)| {
            let b = before
                .iter()
                .find(|(n, _)| n == name)
                .map_or(0.0, |(_, b)| *b);
            (name.clone(), a - b)
        })
        .collect()
}

/// CPU seconds so far of the lab's running daemons and of this process (the fleet), by name.
fn cpu_by_process(state_dir: &Path) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64)> = bosun_lab::LabPaths::new(state_dir)
        .daemons()
        .iter()
        .filter_map(|d| {
            let pid = d.running_pid()?;
            Some((d.name.to_string(), procfs::sample(pid).ok()?.cpu_secs))
        })
        .collect();
    if let Ok(own) = procfs::own() {
        out.push(("fleet (this process)".to_string(), own.cpu_secs));
    }
    out
}

/// The machine's load average now (1, 5, 15 minutes).
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// A run as a text report.
pub fn report(env: &FleetEnv, r: &RunResult) -> String {
    let mut s = String::new();
    let secs = |d: Duration| d.as_secs_f64();
    let _ = writeln!(
        s,
        "== {} nodes, maxUnavailable {} (parallel {}) ==",
        r.nodes, r.max_unavailable, r.parallel
    );
    let _ = writeln!(
        s,
        "wall time: {:.2} s; all tasks Succeeded: {}",
        secs(r.wall),
        r.all_succeeded
    );
    let floors = [
        ("floor (create + start + result per node", &r.floor),
        (
            "floor of the design's writes (the run's 5 NodeTask and 2 Node writes per node, merge patches, nothing else",
            &r.design_floor,
        ),
    ];
    for (what, f) in floors {
        let Some(f) = f else { continue };
        let _ = writeln!(
            s,
            "{what}, {} at a time): {:.2} s, {} writes; ratio {:.2}x",
            f.parallel,
            secs(f.wall),
            f.writes,
            secs(r.wall) / secs(f.wall).max(1e-9)
        );
        if !f.cpu_secs.is_empty() {
            let used: Vec<String> = f
                .cpu_secs
                .iter()
                .map(|(name, secs_)| format!("{name} {secs_:.1} s"))
                .collect();
            let _ = writeln!(s, "  CPU seconds during it: {}", used.join(", "));
        }
    }
    let _ = writeln!(
        s,
        "API requests during the run (verb resource/subresource: count):"
    );
    for ((verb, resource, sub), n) in &r.requests {
        let res = if sub.is_empty() {
            resource.clone()
        } else {
            format!("{resource}/{sub}")
        };
        let _ = writeln!(s, "  {verb:<8} {res:<28} {n}");
    }
    let _ = writeln!(
        s,
        "  (of which Operation GETs by the bench waiting: {})",
        r.own_gets
    );
    // Where the API server's time went: the request kinds it spent the most seconds on
    // (WATCHes excluded: their seconds are the time they stayed open).
    let mut busiest: Vec<_> = r
        .server_seconds
        .iter()
        .filter(|((verb, _, _), _)| verb != "WATCH")
        .collect();
    busiest.sort_by(|a, b| b.1.total_cmp(a.1));
    let served: f64 = busiest.iter().map(|(_, v)| **v).sum();
    let _ = writeln!(
        s,
        "API server time serving requests (WATCH excluded): {served:.1} s; the most:"
    );
    for ((verb, resource, sub), secs_) in busiest.iter().take(8) {
        let n = r
            .requests
            .get(&(verb.clone(), resource.clone(), sub.clone()))
            .copied()
            .unwrap_or(0.0);
        let res = if sub.is_empty() {
            resource.clone()
        } else {
            format!("{resource}/{sub}")
        };
        let _ = writeln!(
            s,
            "  {verb:<8} {res:<28} {secs_:.1} s over {n} ({:.1} ms each)",
            1000.0 * *secs_ / n.max(1.0)
        );
    }
    let _ = writeln!(
        s,
        "watches the API server closed because their client fell behind: {:?}; seconds waited in priority-and-fairness queues: {:?}",
        r.terminated_watchers, r.queue_wait
    );
    let _ = writeln!(
        s,
        "writes: {:?}; Bosun's writes per node-step: {:.2} ({} node-steps)",
        r.writes,
        r.bosun_writes() / r.node_steps.max(1) as f64,
        r.node_steps
    );
    for res in ["nodetasks", "operations", "nodes"] {
        let _ = writeln!(
            s,
            "  {res}: {} writes, {} changes seen by a watch, {} writes that changed nothing",
            r.writes.get(res).copied().unwrap_or(0.0),
            r.changes.get(res).copied().unwrap_or(0),
            r.no_op_writes(res)
        );
    }
    if r.relisted {
        let _ = writeln!(
            s,
            "  (a bench watch relisted: change counts are approximate)"
        );
    }
    let _ = writeln!(
        s,
        "controller: {:.2} CPU s during the run; peak RSS {:.1} MiB, RSS now {:.1} MiB",
        r.controller_cpu_secs,
        r.controller_hwm_kib as f64 / 1024.0,
        r.controller_rss_kib as f64 / 1024.0
    );
    let lists = |m: &BTreeMap<String, u64>| {
        m.iter()
            .map(|(res, n)| format!("{res} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        s,
        "watch lists (one per watch when it starts; more are relists): controller {} (since it started); the {} agents {} (since they started)",
        lists(&r.controller_watch_lists),
        env.nodes.len(),
        lists(&r.agent_watch_lists)
    );
    let others: Vec<String> = r
        .cpu_secs
        .iter()
        .map(|(name, secs_)| format!("{name} {secs_:.1} s"))
        .collect();
    let _ = writeln!(
        s,
        "CPU seconds during the run, of {:.1} core-seconds on {} cores: controller {:.1} s, {}",
        secs(r.wall) * std::thread::available_parallelism().map_or(1, |n| n.get()) as f64,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        r.controller_cpu_secs,
        others.join(", ")
    );
    let c = &r.once;
    if c.passed() {
        let _ = writeln!(
            s,
            "no step ran twice: yes ({} tasks seen, one per node; {} step statuses, each at attempts 1 and seen with one start time; every controller step changed its node)",
            c.tasks_seen, c.steps_checked
        );
    } else {
        let _ = writeln!(
            s,
            "no step ran twice: NO ({} tasks seen, {} step statuses): {} recorded (a second attempt or start, a second task); {} controller steps run again unrecorded (the first run's effect landed, its status write did not; the second found nothing to do):",
            c.tasks_seen,
            c.steps_checked,
            c.violations.len(),
            c.unrecorded_reruns.len()
        );
        for v in c.violations.iter().chain(&c.unrecorded_reruns) {
            let _ = writeln!(s, "  {v}");
        }
    }
    if let Some(x) = &r.restart {
        let opt =
            |v: Option<f64>| v.map_or_else(|| "not seen".to_string(), |v| format!("{v:.2} s"));
        let _ = writeln!(
            s,
            "controller restart: SIGKILL when {} of {} tasks had Succeeded (asked: {}); Lease holder {} -> {}",
            x.succeeded_at_kill,
            x.total,
            x.threshold,
            x.old_holder.as_deref().unwrap_or("none"),
            x.new_holder.as_deref().unwrap_or("not seen"),
        );
        let _ = writeln!(
            s,
            "  new process started {:.2} s after the kill; became leader {} after it started (the Lease wait)",
            secs_between(x.killed_at, x.started_at),
            opt(x.start_to_leader_secs()),
        );
        let _ = writeln!(
            s,
            "  resume (first NodeTask write by the new leader): {} after it became leader, {} after it started",
            opt(x.leader_to_resume_secs()),
            opt(x.start_to_resume_secs()),
        );
        let _ = writeln!(
            s,
            "  (the wall time includes the restart; the bench's Lease GETs while waiting: {}; CPU above is both processes', peak RSS the higher)",
            x.lease_gets
        );
    }
    if let Some(g) = &r.gaps {
        let _ = writeln!(
            s,
            "next-node start gap (n={}): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (resync period {} s)",
            g.count, g.p50_ms, g.p99_ms, g.max_ms, env.resync_seconds
        );
    }
    let _ = writeln!(s, "where the tasks' time went (ms: p50 / p99 / max):");
    for (what, g) in &r.phases {
        let _ = writeln!(
            s,
            "  {what:<44} {:>9.1} {:>9.1} {:>9.1}  (n={})",
            g.p50_ms, g.p99_ms, g.max_ms, g.count
        );
    }
    let _ = writeln!(s, "load average now: {}", load_average());
    s
}

/// The fleet's own figures, as text.
pub fn fleet_report(env: &FleetEnv) -> String {
    let n = env.nodes.len().max(1) as f64;
    format!(
        "fleet: {} nodes added in {:.1} s; {} NodeTask watches opened by the agents; bench RSS {:.1} MiB before the agents, {:.1} MiB with them watching: {:.1} KiB per agent\n",
        env.nodes.len(),
        env.nodes_added_in.as_secs_f64(),
        env.watches_open,
        env.rss_before_kib as f64 / 1024.0,
        env.rss_watching_kib as f64 / 1024.0,
        (env.rss_watching_kib.saturating_sub(env.rss_before_kib)) as f64 / n
    )
}

/// When the agent-idle bench reads the steady resident set after the second step: past
/// tokio's 10 s keep-alive of idle blocking threads.
pub const STEADY_AFTER_SECS: u64 = 15;

/// The real agent binary alone: RSS and CPU while idle with its watch open, RSS through
/// and after its first step, and the time of that step and of the next one.
#[derive(Clone, Debug, Default)]
pub struct IdleResult {
    pub idle_secs: u64,
    /// Before any step, after `idle_secs` with its watches open.
    pub rss_idle_kib: u64,
    pub cpu_idle_secs: f64,
    /// Peak resident set (`VmHWM`) over the first step: verifying, compiling (the disk
    /// cache is empty), describing and running the plugin.
    pub hwm_first_step_kib: u64,
    /// Resident set a few seconds after the first step, and after the second.
    pub rss_after_step_kib: u64,
    pub rss_after_second_step_kib: u64,
    /// Resident set [`STEADY_AFTER_SECS`] after the second step: what the agent keeps.
    pub rss_steady_kib: u64,
    /// Of the resident set before the first step and after it: anonymous memory (the heap,
    /// the instance pool) and file-backed pages (the binary's and libraries' code).
    pub anon_file_idle_kib: (u64, u64),
    pub anon_file_after_step_kib: (u64, u64),
    /// Start to finish of each step as the agent recorded it (its `startedAt` and
    /// `finishedAt`): the first compiles (unless the cache has the plugin), the second
    /// reloads from the disk cache.
    pub first_step_secs: f64,
    pub second_step_secs: f64,
}

/// Runs the agent binary `agent` as the DaemonSet does (with the compiled-plugin cache
/// directory `cache_dir`: empty, or kept from an earlier run) for one fleet node (`idle-0001`), idles it `idle_secs`,
/// then runs two Operations with the no-op step on that node, one after the other.
pub async fn agent_idle(
    lab: &LabHandle,
    idle_secs: u64,
    agent: &Path,
    extra_args: &[&str],
    cache_dir: &Path,
) -> Result<IdleResult> {
    let prefix = "idle-";
    let instance = bosun_e2e::unique("idle");
    let dir = work_dir(&instance);
    let trust_root = publish(lab).await?;
    bosun_lab::remove_fleet_nodes(lab, prefix).await?;
    let nodes = bosun_lab::add_fleet_nodes(lab, prefix, 1).await?;
    prepare_roots(&nodes)?;
    let node = &nodes[0];
    let result = async {
        let mut cmd = Command::new(agent);
        cmd.env("KUBECONFIG", &lab.kubeconfig)
            .env("BOSUN_LOG", "warn")
            .arg("--instance")
            .arg(&instance)
            .arg("--node-name")
            .arg(&node.name)
            .arg("--host-root")
            .arg(&node.host_root)
            .arg("--trust-root")
            .arg(&trust_root)
            .arg("--plugin-dir")
            .arg(dir.join("plugins"))
            .arg("--cache-dir")
            .arg(cache_dir)
            .args(["--service-backend", "simulated"])
            .args(extra_args);
        let mut agent = ChildGuard::spawn("agent", &mut cmd, &dir)?;
        // Its watches open within a few seconds.
        tokio::time::sleep(Duration::from_secs(5)).await;
        agent.check_alive()?;
        let s0 = procfs::sample(agent.pid())?;
        tokio::time::sleep(Duration::from_secs(idle_secs)).await;
        agent.check_alive()?;
        let s1 = procfs::sample(agent.pid())?;
        let mut controller = start_controller(lab, &instance, 30, None, "controller", &dir)?;
        let pid = agent.pid();
        let mut one_step = async |what: &str| -> Result<f64> {
            let name = bosun_e2e::unique(what);
            let op: Operation = serde_json::from_value(json!({
                "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation",
                "metadata": { "name": name, "labels": { INSTANCE_LABEL: instance } },
                "spec": { "custom": { "groups": [{ "name": "one",
                    "nodeSelector": { "matchLabels": { "kubernetes.io/hostname": node.name } },
                    "steps": [noop_step()] }] } },
            }))?;
            let ops: Api<Operation> = Api::all(lab.client.clone());
            ops.create(&PostParams::default(), &op).await?;
            let started = Instant::now();
            loop {
                controller.check_alive()?;
                agent.check_alive()?;
                let op = ops.get(&name).await?;
                let phase = op.status.as_ref().map(|s| s.phase).unwrap_or_default();
                if phase == OperationPhase::Succeeded {
                    break;
                }
                if matches!(phase, OperationPhase::Failed | OperationPhase::Blocked)
                    || started.elapsed() > Duration::from_secs(240)
                {
                    bail!(
                        "the idle agent's Operation is {phase:?}, not Succeeded:\n{}",
                        bosun_e2e::describe_tasks(&lab.client, &name).await
                    );
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let tasks = bosun_e2e::operator::tasks_of(&lab.client, &name).await?;
            let step = tasks
                .values()
                .flat_map(|t| t.status.iter().flat_map(|s| s.steps.iter()))
                .find(|s| s.name == "noop")
                .with_context(|| format!("Operation {name} has no status of its no-op step"))?;
            match (&step.started_at, &step.finished_at) {
                (Some(a), Some(b)) => Ok(secs_between(a.0, b.0)),
                _ => bail!("the no-op step of {name} has no start or finish time"),
            }
        };
        let first_step_secs = one_step("idle-step").await?;
        let hwm_first_step_kib = procfs::sample(pid)?.hwm_kib;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let s2 = procfs::sample(pid)?;
        let second_step_secs = one_step("idle-again").await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let s3 = procfs::sample(pid)?;
        // Steady: past tokio's 10 s keep-alive of the idle blocking threads that ran the
        // step (their stacks are returned when they exit).
        tokio::time::sleep(Duration::from_secs(STEADY_AFTER_SECS - 3)).await;
        let s4 = procfs::sample(pid)?;
        Ok(IdleResult {
            idle_secs,
            rss_idle_kib: s1.rss_kib,
            cpu_idle_secs: s1.cpu_secs - s0.cpu_secs,
            hwm_first_step_kib,
            rss_after_step_kib: s2.rss_kib,
            rss_after_second_step_kib: s3.rss_kib,
            rss_steady_kib: s4.rss_kib,
            anon_file_idle_kib: (s1.rss_anon_kib, s1.rss_file_kib),
            anon_file_after_step_kib: (s2.rss_anon_kib, s2.rss_file_kib),
            first_step_secs,
            second_step_secs,
        })
    }
    .await;
    delete_instance(&lab.client, &instance).await?;
    bosun_lab::remove_fleet_nodes(lab, prefix).await?;
    result
}

/// The names of `tasks`, for messages.
pub fn names(tasks: &[NodeTask]) -> Vec<String> {
    tasks.iter().map(ResourceExt::name_any).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bosun_telemetry::Watched;

    #[test]
    fn watch_lists_are_read_from_a_metrics_text() {
        let m = bosun_telemetry::Metrics::new();
        m.watch_listed(Watched::NodeTasks);
        m.watch_listed(Watched::NodeTasks);
        m.watch_listed(Watched::Operations);
        let lists = parse_watch_lists(&m.encode());
        assert_eq!(lists.get("nodetasks"), Some(&2));
        assert_eq!(lists.get("operations"), Some(&1));
        assert_eq!(lists.get("nodes"), Some(&0));
        assert_eq!(lists.get("clusterlifecycles"), Some(&0));
        assert_eq!(lists.len(), 5, "{lists:?}");
    }

    fn task(steps: &[(&str, i64, i64)]) -> NodeTask {
        let at = |us: i64| {
            k8s_openapi::jiff::Timestamp::from_microsecond(us)
                .unwrap()
                .to_string()
        };
        let steps: Vec<_> = steps
            .iter()
            .map(|(name, start, end)| {
                json!({ "name": name, "phase": "Succeeded", "attempts": 1,
                        "startedAt": at(*start), "finishedAt": at(*end) })
            })
            .collect();
        let spec_steps: Vec<_> = steps
            .iter()
            .map(|s| json!({ "name": s["name"], "plugin": "good", "action": "noop" }))
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeTask",
            "metadata": { "name": "t" },
            "spec": { "operation": "op", "nodeName": "n", "group": "g",
                      "steps": spec_steps },
            "status": { "phase": "Succeeded", "steps": steps },
        }))
        .unwrap()
    }

    #[test]
    fn gaps_run_from_one_tasks_last_finish_to_the_next_tasks_first_start() {
        // Given out of order: sorted by start.
        let tasks = [
            task(&[("a", 5_000_000, 5_100_000), ("b", 5_100_000, 5_200_000)]),
            task(&[("a", 1_000_000, 1_500_000), ("b", 1_500_000, 2_000_000)]),
            task(&[("a", 2_030_000, 3_000_000)]),
        ];
        assert_eq!(gaps_ms(&tasks), vec![30.0, 2000.0]);
    }

    #[test]
    fn phases_split_each_task_into_step_runs_and_hand_overs() {
        let tasks = [
            task(&[("a", 1_000_000, 1_010_000), ("b", 1_050_000, 1_150_000)]),
            task(&[("a", 3_000_000, 3_020_000), ("b", 3_020_000, 3_220_000)]),
        ];
        let phases = phases_ms(&tasks);
        let names: Vec<&str> = phases.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "a started, after the earliest task's",
                "a ran",
                "a finished -> b started",
                "b ran"
            ]
        );
        let max = |i: usize| phases[i].1.max_ms;
        assert_eq!(max(0), 2000.0);
        assert_eq!((phases[1].1.p50_ms, max(1)), (10.0, 20.0));
        assert_eq!((phases[2].1.p50_ms, max(2)), (0.0, 40.0));
        assert_eq!((phases[3].1.p50_ms, max(3)), (100.0, 200.0));
    }

    #[test]
    fn spread_is_nearest_rank() {
        let s = Spread::of((1..=100).map(f64::from).rev().collect());
        assert_eq!(
            (s.count, s.p50_ms, s.p99_ms, s.max_ms),
            (100, 50.0, 99.0, 100.0)
        );
        assert_eq!(Spread::of(vec![]).count, 0);
    }

    #[test]
    fn the_restart_point_is_a_percentage_of_the_tasks_rounded_up() {
        assert_eq!(parse_percent("50%").unwrap(), 50);
        assert_eq!(parse_percent("50").unwrap(), 50);
        for bad in ["0%", "100%", "half", "-5%"] {
            assert!(parse_percent(bad).is_err(), "{bad}");
        }
        assert_eq!(restart_threshold(40, 50), 20);
        assert_eq!(restart_threshold(41, 50), 21);
        assert_eq!(restart_threshold(1000, 50), 500);
        assert_eq!(restart_threshold(3, 1), 1);
    }

    #[test]
    fn max_unavailable_is_a_number_or_a_percentage() {
        let op = operation("o", "i", "fleet-", "10%").unwrap();
        assert_eq!(op["spec"]["rollout"]["maxUnavailable"], json!("10%"));
        let op = operation("o", "i", "fleet-", "1").unwrap();
        assert_eq!(op["spec"]["rollout"]["maxUnavailable"], json!(1));
        assert_eq!(
            op["spec"]["custom"]["groups"][0]["nodeSelector"]["matchLabels"][FLEET_LABEL],
            json!("fleet")
        );
        let e = operation("o", "i", "fleet-", "ten")
            .unwrap_err()
            .to_string();
        assert!(e.contains("a whole number or a percentage"), "{e}");
    }
}
