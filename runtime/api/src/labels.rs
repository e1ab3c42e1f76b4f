//! The labels and annotations Bosun reads and writes on its objects: the one place their
//! keys are spelled. The planner writes the NodeTask labels; `bosun-cluster` builds the
//! selectors and reads the annotations from them.

/// The owning Operation's name (on NodeTasks).
pub const OPERATION: &str = "bosun.dev/operation";
/// The node's name (on NodeTasks).
pub const NODE: &str = "bosun.dev/node";
/// The planned group's name (on NodeTasks).
pub const GROUP: &str = "bosun.dev/group";
/// Scopes Operations, their NodeTasks and Policies to one install of the controller and
/// agents (their `--instance NAME`), for running installs side by side, and tests.
pub const INSTANCE: &str = "bosun.dev/instance";

/// On an Operation a ClusterLifecycle generated: what it was generated for (`upgrade` or
/// `renewCertificates`). The reconciler finds its Operations by this label; it never owns
/// them through an ownerReference, so deleting the ClusterLifecycle deletes no Operation.
pub const LIFECYCLE: &str = "bosun.dev/lifecycle";

/// Annotations Bosun reads or writes.
pub mod annotations {
    /// On a NodeTask while its Operation is paused (`"true"`): the agent starts no new step
    /// of it; a running step finishes. Set and removed by the controller.
    pub const PAUSED: &str = "bosun.dev/paused";
    /// On a generated Operation: why the ClusterLifecycle generated it (one line).
    pub const LIFECYCLE_REASON: &str = "bosun.dev/lifecycle-reason";
    /// On a Node: the last cordon or uncordon Bosun made, `"<NodeTask name> cordoned"` or
    /// `"<NodeTask name> uncordoned"`, written in the same patch as `spec.unschedulable`. A
    /// controller that restarted between the patch and the step's status write reads it
    /// and records the step as done by this task instead of calling it a no-op.
    pub const CORDON: &str = "bosun.dev/cordon";
}
