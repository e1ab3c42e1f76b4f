//! Plans an Operation into per-node tasks, and decides which tasks may start. Pure
//! functions over API types: no Kubernetes client, no clock, no I/O, so every decision the
//! controller makes about order and concurrency is unit-tested here.
//!
//! - [`plan()`]: (Operation spec, node snapshot, frozen plan if any) → frozen plan and
//!   NodeTask specs.
//! - [`schedule()`]: (frozen plan, NodeTask states, nodes present) → which tasks to create,
//!   start, hold for approval or mark Invalid, and the Operation's phase.
//! - [`state`]: the NodeTask, step and Operation state machines as transition functions.
//! - [`rollout`]: `maxUnavailable` → how many nodes of a group run at once.
//! - [`selector`]: label selector matching.

pub mod nodes;
pub mod plan;
pub mod rollout;
pub mod schedule;
pub mod selector;
pub mod state;

pub use nodes::NodeInfo;
pub use plan::{
    OperationIdentity, PlanError, PlanOutput, PlannedTask, label_value, plan, plan_identified,
    snapshot_label, stable_hash, task_name,
};
pub use schedule::{Schedule, TaskView, schedule};
