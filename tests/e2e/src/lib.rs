//! End-to-end tests of Bosun against the lab's real control plane (`tests/` of this crate),
//! and the support library they all use (this crate's library).
//!
//! Every test starts or reuses the lab through `bosun_lab::ensure_lab`. The library owns
//! what tests would otherwise copy:
//!
//! - [`paths`]: the workspace, its target directory, and workspace binaries refused when
//!   older than their sources ([`paths::binary`]); wasm plugins built on demand.
//! - [`processes`]: child processes killed (SIGKILL) and reaped when the guard drops.
//! - [`cluster`]: CRDs applied from `deploy/crds`, signed plugins published (ConfigMap +
//!   Plugin resource with the grants a test gives), unique names.
//! - [`identity`]: `deploy/`'s ServiceAccounts and RBAC, as clients and kubeconfigs made
//!   from their tokens, for tests and processes that must run with exactly those rights.
//! - [`operator`]: the real `bosun-controller` and one `bosun-agent` per lab node, scoped
//!   to an *instance* so tests running side by side never act on each other's objects;
//!   Operations created with the instance label; waiting for an Operation or NodeTask
//!   with a deadline and a failure message that dumps every task's status.
//! - [`lifecycle`]: the ClusterLifecycle singleton reset before and removed after a test
//!   of the declarative layer, the controller started with its reconciler, waits on it.
//! - [`audit`]: the lab API server's audit log, as the writes each process sent.
//! - [`admin`]: a free port for a process's admin server, and requests to it.
//! - [`lock_lab_nodes`]: the lab's nodes are shared (cordon state, host root files):
//!   tests that run Operations over them take this lock, so within one test binary they
//!   run one at a time.

pub mod admin;
pub mod audit;
pub mod cluster;
pub mod identity;
pub mod lifecycle;
pub mod operator;
pub mod paths;
pub mod processes;
pub mod stall;

use std::time::Duration;

pub use cluster::{apply_crds, events_about, publish_plugin, publish_test_steps, unique};
pub use operator::{Operator, describe_tasks};
pub use paths::{binary, binary_of, build_plugin, target_dir, workspace_root};
pub use processes::Processes;

/// Upper bound for the cluster and the operator's processes to do a piece of work;
/// reaching it fails the test with what was seen (it is not a performance assertion).
pub const DEADLINE: Duration = Duration::from_secs(240);

/// The field manager tests write with.
pub const MANAGER: &str = "bosun-e2e";

static LAB_NODES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Serialises tests that run Operations over the lab's nodes. The nodes are shared by
/// every test of a binary: a cordon changes what the planner sees, steps write files in
/// the host roots, and a test that hashes the host roots must not see another test's
/// writes. Hold the guard for the whole test. (Test binaries do not run at the same time
/// on one lab: `cargo test` runs them one after another.)
pub async fn lock_lab_nodes() -> tokio::sync::MutexGuard<'static, ()> {
    LAB_NODES.lock().await
}
