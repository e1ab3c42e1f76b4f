//! Bosun's Kubernetes API types (group `bosun.dev`, version `v1alpha1`, all cluster-scoped).
//! No I/O: the controller, agent and CLI share these definitions and the planner reasons
//! about them without a cluster.
//!
//! - [`Operation`]: what a user wants done (upgrade, certificate renewal, custom steps).
//! - [`NodeTask`]: one Operation's work on one node.
//! - [`Plugin`]: a trusted WebAssembly plugin with its grants.
//! - [`Policy`]: a Rego module gating Operations and steps.
//! - [`ClusterLifecycle`]: the desired version and certificate freshness of the cluster,
//!   reconciled into generated Operations.
//! - [`NodeReport`]: what an agent finds on its node, kept current.
//!
//! Validation lives in the schema (see [`crd`]), so the API server refuses bad input.

pub mod crd;
pub mod grants;
pub mod labels;
pub mod lifecycle;
pub mod node_report;
pub mod node_task;
pub mod operation;
pub mod plugin;
pub mod policy;
mod schema;

pub use lifecycle::{ClusterLifecycle, ClusterLifecycleSpec, ClusterLifecycleStatus};
pub use node_report::{NodeReport, NodeReportSpec};
pub use node_task::{
    BlockReason, NodeTask, NodeTaskPhase, NodeTaskSpec, NodeTaskStatus, Recovery, StepPhase,
    StepStatus,
};
pub use operation::{
    CustomGroup, CustomSpec, ExecutionMode, KubePackage, Operation, OperationPhase, OperationSpec,
    OperationStatus, Plan, PlannedGroup, RenewCertificatesSpec, Rollout, RunsOn, Step, UpgradeSpec,
};
pub use plugin::{Plugin, PluginSpec};
pub use policy::{Enforcement, Policy, PolicySpec, PolicyStatus};

/// The API group.
pub const GROUP: &str = "bosun.dev";
/// The API version.
pub const VERSION: &str = "v1alpha1";
