//! The Bosun controller: turns an Operation into NodeTasks and drives them in plan order.
//!
//! - [`reconcile`]: the reconciler (`reconcile(Arc<Operation>, Arc<Context>) -> Result<Action>`
//!   plus [`error_policy`](reconcile::error_policy)), which plans with `bosun-planner`,
//!   freezes the plan in status, creates NodeTasks, runs controller-side steps and starts
//!   tasks when the rollout allows.
//! - [`summary`]: the Operation's status summary (message, conditions), a pure function.
//! - [`recovery`]: a person's `spec.recovery` (Retry, Skip), `failurePolicy: Retry`
//!   (automatic retries with backoff, by requeue), and `spec.paused` mirrored onto tasks.
//! - [`actions`]: the controller steps (`cordon`, `drain`, `uncordon`, `waitNodeReady`,
//!   `waitApiServer`) as non-blocking passes; [`drain`] the eviction pass and its messages;
//!   [`health`] the health gates a task passes before it succeeds.
//! - [`operation_gate`]: the operation policy decision point (before planning, before each
//!   group); [`policy_status`]: the status of every Policy object.
//! - [`leader`]: leader election through a Lease (only the holder runs [`run`]); [`events`]:
//!   Events for Operations and NodeTasks; [`ttl`]: `ttlSecondsAfterFinished`.
//! - [`exclusion`]: one Operation at a time per node (a task waits while another
//!   Operation's task holds its node).
//! - The code shared with the agent (instance selector, pause mark, Policy watch, cluster
//!   readers, Events, typed NodeTask status writes) is in `bosun-cluster`; where a NodeTask
//!   stands in its step list is `bosun_planner::state`, read the same way by both.
//! - [`lifecycle`]: the ClusterLifecycle reconciler (desired version and certificate
//!   freshness, reconciled into generated Operations; adoption on a fresh install).
//! - [`cache`]: the watch-backed Node and NodeTask stores the reconciler reads (no LIST per
//!   reconcile), and how a reconcile sees the controller's own writes in them.
//! - [`inflight`]: running tasks' controller steps advanced in the background of their
//!   Operation's reconcile, which waits for them only a moment.
//! - [`run`]: wires the reconciler into a kube-runtime `Controller` watching the Operations
//!   of its instance ([`instance_selector`]) and the NodeTasks they own.
//!
//! See docs/operator.md for the semantics and what is not done yet.

pub mod actions;
pub mod cache;
pub mod drain;
pub mod error;
pub mod events;
pub mod exclusion;
#[cfg(test)]
mod fake_api;
pub mod health;
pub mod inflight;
pub mod leader;
pub mod lifecycle;
pub mod operation_gate;
pub mod policy_status;
pub mod reboot_gate;
pub mod reconcile;
pub mod recovery;
pub mod summary;
pub mod time;
pub mod ttl;

use std::sync::Arc;
use std::time::Duration;

use bosun_api::node_task::NodeTask;
use bosun_api::operation::Operation;
use bosun_cluster::instance_selector;
use bosun_cluster::policies::PolicyWatch;
use bosun_telemetry::Watched;
use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::Controller;

pub use error::{Error, Result};
pub use reconcile::{Context, error_policy, reconcile};

/// The field manager the controller writes with unless told otherwise.
pub const FIELD_MANAGER: &str = "bosun-controller";

/// Runs the controller until a shutdown signal (SIGTERM, Ctrl-C). Watches the Operations
/// of its instance (see [`instance_selector`]) and their NodeTasks (mapped to their owning
/// Operation).
///
/// `identity` names this replica in the Events it publishes (its leader-election identity).
/// With `lifecycle`, the ClusterLifecycle reconciler runs too, on changes (see
/// [`lifecycle::run`]; its safety-net resync is [`lifecycle::RESYNC`] or `resync` if longer).
pub async fn run(
    client: Client,
    manager: String,
    resync: Duration,
    instance: Option<String>,
    identity: String,
    lifecycle: bool,
    gates: reboot_gate::Gates,
) {
    if lifecycle {
        tokio::spawn(lifecycle::run(
            lifecycle::Lifecycle {
                client: client.clone(),
                manager: manager.clone(),
                instance: instance.clone(),
            },
            lifecycle::RESYNC.max(resync),
        ));
    }
    let operations: Api<Operation> = Api::all(client.clone());
    let selector = instance_selector(instance.as_deref());
    // Policies of this instance: the operation gate, their status, and a reconcile of every
    // Operation whenever they change (a fixed policy unblocks without waiting for a resync).
    let policies = Arc::new(PolicyWatch::new());
    let policy_changes = policies.changes(
        client.clone(),
        bosun_cluster::watch::controller_config(),
        Some(selector.clone()),
    );
    tokio::spawn(policy_status::run_status(
        client.clone(),
        manager.clone(),
        Some(selector.clone()),
    ));
    let events = Arc::new(events::Events::new(client.clone(), identity));
    // The Nodes and NodeTasks the reconciler reads, kept by watches (see `cache`): the Node
    // watch runs beside the controller below, the NodeTask watch is the one that triggers
    // reconciles. Built here, so a new leader lists them before its first reconcile.
    let caches = Arc::new(cache::Caches::new());
    let (Some(nodes_watch), Some(task_triggers)) = (
        caches.nodes_watch(client.clone()),
        caches.task_triggers(
            client.clone(),
            bosun_cluster::watch::controller_config().labels(&selector),
        ),
    ) else {
        unreachable!("a new Caches gives its watches once");
    };
    // A NodeTask watch left open by an API server that stopped delivering is opened again
    // (see `Caches::keep_tasks_fresh`).
    let tasks_fresh = caches.keep_tasks_fresh(client.clone());
    // A task advanced in the background after its reconcile stopped waiting wakes its
    // Operation as a change of the task would (see `inflight`).
    let (retrigger, advanced) = tokio::sync::mpsc::unbounded_channel::<NodeTask>();
    let advanced = futures::stream::unfold(advanced, |mut rx| async move {
        rx.recv().await.map(|task| (Ok(task), rx))
    });
    let ctx = Arc::new(Context {
        client: caches.recording(client),
        caches,
        manager,
        resync,
        instance,
        policies,
        events,
        exclusion: Default::default(),
        waiters: Default::default(),
        own_writes: Default::default(),
        inflight: Default::default(),
        retrigger: Some(retrigger),
        gates: Arc::new(gates),
    });
    // A task change wakes its own Operation (as `owns` would) and the Operations waiting
    // for its node (see `exclusion::Waiters`): no timer for a held node.
    let waiters = ctx.waiters.clone();
    let wake = move |task: NodeTask| tasks_to_wake(&task, &waiters);
    let triggers = futures::stream::select(task_triggers, advanced);
    // The Operation watch, as `Controller::new` builds it, with its lists counted
    // (`bosun_watch_lists_total`).
    // An Operation created or edited while that watch reached an API server that stopped
    // delivering is found by a list (`bosun_cluster::watch::keep_listed_fresh`).
    let operation_liveness = bosun_cluster::watch::Liveness::new(Watched::Operations);
    let operation_config = bosun_cluster::watch::controller_config().labels(&selector);
    let (operation_triggers, operation_store) = bosun_cluster::watch::counted_controller_source(
        operations.clone(),
        operation_config.clone(),
        operation_liveness.clone(),
    );
    let operations_fresh = bosun_cluster::watch::keep_listed_fresh(
        operations,
        operation_config,
        operation_store.clone(),
        operation_liveness,
        bosun_cluster::watch::LISTED_FRESHNESS,
    );
    let controller = Controller::for_stream(operation_triggers, operation_store)
        .watches_stream(triggers, wake)
        .reconcile_all_on(futures::stream::iter(policy_changes).flatten())
        .trigger_backoff(bosun_cluster::watch::WatchBackoff::new(
            bosun_cluster::watch::seed_of("bosun-controller"),
        ))
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => tracing::debug!(operation = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile error"),
            }
        });
    // The Node watch and the freshness checks never end; the controller ends on a shutdown
    // signal, and with it this.
    tokio::select! {
        () = controller => {}
        () = nodes_watch => {}
        () = tasks_fresh => {}
        () = operations_fresh => {}
    }
}

/// The Operations a change of `task` wakes: its owner, and the Operations waiting for its
/// node (taken out of `waiters`).
fn tasks_to_wake(
    task: &NodeTask,
    waiters: &exclusion::Waiters,
) -> Vec<kube::runtime::reflector::ObjectRef<Operation>> {
    use kube::Resource as _;
    let api_version = Operation::api_version(&());
    let kind = Operation::kind(&());
    task.metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|o| o.kind == kind && o.api_version == api_version)
        .map(|o| o.name.clone())
        .chain(waiters.woken_by(task))
        .map(|name| kube::runtime::reflector::ObjectRef::new(&name))
        .collect()
}
