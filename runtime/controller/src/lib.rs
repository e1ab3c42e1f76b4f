//! The Bosun controller: turns an Operation into NodeTasks and drives them in plan order.
//!
//! - [`reconcile`]: the reconciler (`reconcile(Arc<Operation>, Arc<Context>) -> Result<Action>`
//!   plus [`error_policy`](reconcile::error_policy)), which plans with `bosun-planner`,
//!   freezes the plan in status, creates NodeTasks, runs controller-side steps and starts
//!   tasks when the rollout allows.
//! - [`recovery`]: a person's `spec.recovery` (Retry, Skip), `failurePolicy: Retry`
//!   (automatic retries with backoff, by requeue), and `spec.paused` mirrored onto tasks.
//! - [`actions`]: the controller steps (`cordon`, `drain`, `uncordon`, `waitNodeReady`,
//!   `waitApiServer`) as non-blocking passes; [`drain`] the eviction pass and its messages;
//!   [`gates`] the health gates a task passes before it succeeds.
//! - [`leader`]: leader election through a Lease (only the holder runs [`run`]); [`events`]:
//!   Events for Operations and NodeTasks; [`ttl`]: `ttlSecondsAfterFinished`.
//! - [`exclusion`]: one Operation at a time per node (a task waits while another
//!   Operation's task holds its node).
//! - [`progress`]: where a NodeTask stands in its step list (re-exported from
//!   `bosun_planner::state`); shared with the agent so both agree whose turn a step is.
//! - [`run`]: wires the reconciler into a kube-runtime `Controller` watching the Operations
//!   of its instance ([`instance_selector`]) and the NodeTasks they own.
//!
//! See docs/operator.md for the semantics and what is not done yet.

pub mod actions;
pub mod drain;
pub mod error;
pub mod events;
pub mod exclusion;
#[cfg(test)]
mod fake_api;
pub mod gate;
pub mod gates;
pub mod leader;
pub mod progress;
pub mod reconcile;
pub mod recovery;
pub mod time;
pub mod ttl;

use std::sync::Arc;
use std::time::Duration;

use bosun_api::node_task::NodeTask;
use bosun_api::operation::Operation;
use futures::StreamExt;
use kube::Client;
use kube::api::Api;
use kube::runtime::{Controller, watcher};

pub use error::{Error, Result};
pub use reconcile::{Context, error_policy, reconcile};

/// The field manager the controller writes with unless told otherwise.
pub const FIELD_MANAGER: &str = "bosun-controller";

/// The label that scopes Operations and their NodeTasks to one install of the controller
/// and agents (their `--instance NAME`), for running installs side by side, and tests.
pub const INSTANCE_LABEL: &str = "bosun.dev/instance";

/// The label selector of the objects an install with `instance` acts on: those labelled
/// `bosun.dev/instance=<instance>`, or, with no instance, only those without the label
/// (so a default install never touches a side-by-side install's objects).
pub fn instance_selector(instance: Option<&str>) -> String {
    match instance {
        Some(name) => format!("{INSTANCE_LABEL}={name}"),
        None => format!("!{INSTANCE_LABEL}"),
    }
}

/// Runs the controller until a shutdown signal (SIGTERM, Ctrl-C). Watches the Operations
/// of its instance (see [`instance_selector`]) and their NodeTasks (mapped to their owning
/// Operation).
///
/// `identity` names this replica in the Events it publishes (its leader-election identity).
pub async fn run(
    client: Client,
    manager: String,
    resync: Duration,
    instance: Option<String>,
    identity: String,
) {
    let operations: Api<Operation> = Api::all(client.clone());
    let tasks: Api<NodeTask> = Api::all(client.clone());
    let selector = instance_selector(instance.as_deref());
    // Policies of this instance: the operation gate, their status, and a reconcile of every
    // Operation whenever they change (a fixed policy unblocks without waiting for a resync).
    let policies = Arc::new(gate::PolicyWatch::new());
    let policy_changes = policies.changes(client.clone(), Some(selector.clone()));
    tokio::spawn(gate::run_status(
        client.clone(),
        manager.clone(),
        Some(selector.clone()),
    ));
    let events = Arc::new(events::Events::new(client.clone(), identity));
    let ctx = Arc::new(Context {
        client,
        manager,
        resync,
        instance,
        policies,
        events,
        exclusion: Default::default(),
    });
    Controller::new(operations, watcher::Config::default().labels(&selector))
        .owns(tasks, watcher::Config::default().labels(&selector))
        .reconcile_all_on(futures::stream::iter(policy_changes).flatten())
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok((obj, _)) => tracing::debug!(operation = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile error"),
            }
        })
        .await;
}
