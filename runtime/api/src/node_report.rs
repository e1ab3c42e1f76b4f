//! The `NodeReport` resource: what an agent finds on its node, kept current.
//!
//! One per node, named after it, written only by that node's agent (the admission policy
//! `deploy/admission/agent-own-node.yaml` refuses any other node's agent). The agent writes
//! it when it starts, when a fact changes, and never when nothing changed; the controller
//! reads the reports to compare a [`crate::ClusterLifecycle`]'s desired state with the
//! cluster's.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::node_task::NodeFacts;

/// What the agent of one node last found on it. Cluster-scoped, named after the node.
// Each `printcolumn(...)` repeats keys such as `type_ = "string"`, which clippy takes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "bosun.dev",
    version = "v1alpha1",
    kind = "NodeReport",
    shortname = "nreport",
    category = "bosun",
    derive = "PartialEq",
    doc = "A NodeReport holds what the Bosun agent of one node found on it (versions, OS, certificate expiry); the agent keeps it current and the controller reads it for the ClusterLifecycle.",
    printcolumn(
        name = "Kubelet",
        type_ = "string",
        json_path = ".spec.facts.kubeletVersion"
    ),
    printcolumn(
        name = "Kubeadm",
        type_ = "string",
        json_path = ".spec.facts.kubeadmVersion"
    ),
    printcolumn(
        name = "Cert-Expiry",
        type_ = "string",
        json_path = ".spec.facts.certificates[0].notAfter",
        description = "The soonest certificate expiry on the node"
    ),
    printcolumn(
        name = "Reboot",
        type_ = "boolean",
        json_path = ".spec.facts.reboot.required",
        description = "Whether the node needs a reboot"
    ),
    printcolumn(
        name = "Kubectl",
        type_ = "string",
        json_path = ".spec.facts.kubectlVersion",
        priority = 1
    ),
    printcolumn(
        name = "OS",
        type_ = "string",
        json_path = ".spec.facts.os",
        priority = 1
    ),
    printcolumn(
        name = "Collected",
        type_ = "date",
        json_path = ".spec.facts.collectedAt"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self.nodeName == oldSelf.nodeName",
    "message": "spec.nodeName cannot change: a NodeReport belongs to one node",
}]))]
pub struct NodeReportSpec {
    /// The node reported on; the object's name is the same.
    #[schemars(length(min = 1, max = 253))]
    pub node_name: String,
    /// The facts, read at `facts.collectedAt`.
    pub facts: NodeFacts,
}
