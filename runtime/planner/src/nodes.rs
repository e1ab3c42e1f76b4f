//! The planner's view of a cluster node: a snapshot the controller takes from the Node
//! objects when it plans.

use std::collections::BTreeMap;

/// The label kubeadm puts on control-plane nodes.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// The label older clusters used for control-plane nodes.
pub const LEGACY_MASTER_LABEL: &str = "node-role.kubernetes.io/master";

/// One node as the planner sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// The node's Ready condition is True.
    pub ready: bool,
    /// `spec.unschedulable` (cordoned) at the time of the snapshot.
    pub unschedulable: bool,
    /// When cordoned by Bosun: the NodeTask whose `cordon` or `drain` did it, from the node's
    /// `bosun.dev/cordon` annotation (`<task> cordoned`). A cordon Bosun made and never undid
    /// (its Operation deleted mid-way) is Bosun's to undo; only a person's cordon is left
    /// alone.
    pub cordoned_by: Option<String>,
}

impl NodeInfo {
    /// A Ready, schedulable node with the given labels.
    pub fn new<const N: usize>(name: &str, labels: [(&str, &str); N]) -> Self {
        NodeInfo {
            name: name.to_string(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ready: true,
            unschedulable: false,
            cordoned_by: None,
        }
    }

    /// A Ready control-plane node (labelled as kubeadm does).
    pub fn control_plane(name: &str) -> Self {
        Self::new(name, [(CONTROL_PLANE_LABEL, "")])
    }

    /// A Ready worker node.
    pub fn worker(name: &str) -> Self {
        Self::new(name, [])
    }

    /// True for a control-plane node: it carries kubeadm's control-plane label (or the
    /// legacy master label), whatever the value.
    pub fn is_control_plane(&self) -> bool {
        self.labels.contains_key(CONTROL_PLANE_LABEL)
            || self.labels.contains_key(LEGACY_MASTER_LABEL)
    }
}
