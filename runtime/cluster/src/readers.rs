//! What the policy inputs read from the cluster, the same way on the controller and the
//! agent: the cluster's version and annotations, the control-plane nodes, a node's roles and
//! Ready condition, and an Operation as the policies name it.

use std::collections::{BTreeMap, BTreeSet};

use bosun_api::node_task::{NodeTask, NodeTaskPhase};
use bosun_api::operation::{ExecutionMode, Operation};
use bosun_policy::input::{ControlPlaneNode, OperationKind, OperationRef};
use k8s_openapi::api::core::v1::{Namespace, Node, NodeCondition};
use kube::api::{Api, GetParams, ListParams};
use kube::{Client, ResourceExt};

use crate::{Error, Result};

/// The Kubernetes version the API server reports, for example `v1.34.4`.
pub async fn cluster_version(client: &Client) -> Option<String> {
    client.apiserver_version().await.ok().map(|i| i.git_version)
}

/// Cluster-wide annotations: those of the `kube-system` Namespace (where
/// `bosun.dev/change-freeze` is set).
pub async fn cluster_annotations(client: &Client) -> BTreeMap<String, String> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .get_opt("kube-system")
        .await
        .ok()
        .flatten()
        .map(|n| n.annotations().clone())
        .unwrap_or_default()
}

/// The node's roles from its `node-role.kubernetes.io/<role>` labels (`worker` when none).
pub fn roles_of(node: &Node) -> Vec<String> {
    let mut roles: Vec<String> = node
        .labels()
        .keys()
        .filter_map(|k| k.strip_prefix("node-role.kubernetes.io/"))
        .map(str::to_owned)
        .collect();
    if roles.is_empty() {
        roles.push("worker".into());
    }
    roles
}

/// The Node's Ready condition, if it reports one.
pub fn ready_condition(node: &Node) -> Option<&NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"))
}

/// True when the Node's Ready condition is True.
pub fn is_ready(node: &Node) -> bool {
    ready_condition(node).is_some_and(|c| c.status == "True")
}

/// The label selector of the control-plane Nodes (the label [`roles_of`] reads as the
/// `control-plane` role).
pub const CONTROL_PLANE_SELECTOR: &str = "node-role.kubernetes.io/control-plane";

/// Every control-plane node among `nodes`: Ready, and whether a NodeTask of any Operation is
/// Running on it now. Lists only the NodeTasks of those nodes (by their node label), not
/// every task of the cluster: every agent asks this before every step.
///
/// `not_older_than`: a NodeTask `resourceVersion` the reader has already seen (an agent's
/// own task, from its watch). The list is then served from the API server's watch cache as
/// of that version or later (`resourceVersionMatch=NotOlderThan`) instead of a consistent
/// read: at 1,000 agents starting their steps together, those consistent lists were 8,361
/// of the API server's 8,787 timed-out requests (docs/benchmarks.md). The answer is never
/// older than what the reader knew. `None`: a consistent read, as before.
pub async fn control_plane(
    client: &Client,
    nodes: &[Node],
    not_older_than: Option<&str>,
) -> Result<Vec<ControlPlaneNode>> {
    let cps: Vec<&Node> = nodes
        .iter()
        .filter(|n| roles_of(n).iter().any(|r| r == "control-plane"))
        .collect();
    if cps.is_empty() {
        return Ok(Vec::new());
    }
    let values: BTreeSet<String> = cps
        .iter()
        .map(|n| bosun_planner::label_value(&n.name_any()))
        .collect();
    let selector = format!(
        "{} in ({})",
        bosun_api::labels::NODE,
        values.into_iter().collect::<Vec<_>>().join(",")
    );
    let tasks: Api<NodeTask> = Api::all(client.clone());
    let running: BTreeSet<String> = tasks
        .list(&control_plane_tasks(&selector, not_older_than))
        .await
        .map_err(Error::kube("listing the control-plane nodes' NodeTasks"))?
        .items
        .into_iter()
        .filter(|t| {
            t.status
                .as_ref()
                .is_some_and(|s| s.phase == NodeTaskPhase::Running)
        })
        .map(|t| t.spec.node_name)
        .collect();
    Ok(cps
        .into_iter()
        .map(|n| ControlPlaneNode {
            name: n.name_any(),
            ready: is_ready(n),
            in_progress: running.contains(&n.name_any()),
        })
        .collect())
}

/// The list of the control-plane nodes' NodeTasks [`control_plane`] sends.
fn control_plane_tasks(selector: &str, not_older_than: Option<&str>) -> ListParams {
    no_older_than(ListParams::default().labels(selector), not_older_than)
}

/// `params` served from the API server's watch cache, never older than `version` (a
/// `resourceVersion` the reader has seen, e.g. of the object that triggered it); a
/// consistent read when there is none (which costs the API server a look at etcd first).
pub fn no_older_than(params: ListParams, version: Option<&str>) -> ListParams {
    match version {
        Some(rv) if !rv.is_empty() => params
            .at(rv)
            .matching(kube::api::VersionMatch::NotOlderThan),
        _ => params,
    }
}

/// The object `name` as the API server's watch cache holds it (`resourceVersion=0`: no
/// wait for the cache to reach any version, no look at etcd), or, when the cache does not
/// hold it, as a consistent read says (`None` when it does not exist). For an object whose
/// fields the reader needs are set when it is made (an Operation's kind and target version
/// are immutable): any copy of it is as good as the newest, and one that is missing may be
/// only a cache behind its creation.
///
/// A read no older than a given version of *another* resource (the task that triggered the
/// reader) makes the cache of this one wait for a progress notice from etcd, and under load
/// that wait ran past the API server's 3 s limit: 2,711 `504 Too large resource version`
/// answers in one 1,000-node run, each a failed reconcile retried seconds later
/// (docs/benchmarks.md).
pub async fn get_cached_or_consistent<K>(api: &Api<K>, name: &str) -> kube::Result<Option<K>>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.get_with(name, &GetParams::any()).await {
        Ok(object) => Ok(Some(object)),
        Err(kube::Error::Api(status)) if status.is_not_found() => api.get_opt(name).await,
        Err(e) => Err(e),
    }
}

/// Which kind of work an Operation's spec asks for.
pub fn operation_kind(op: &Operation) -> OperationKind {
    if op.spec.upgrade.is_some() {
        OperationKind::Upgrade
    } else if op.spec.renew_certificates.is_some() {
        OperationKind::RenewCertificates
    } else if op.spec.reboot.is_some() {
        OperationKind::Reboot
    } else {
        OperationKind::Custom
    }
}

/// The Operation as the policy input names it.
pub fn operation_ref(op: &Operation) -> OperationRef {
    let kind = operation_kind(op);
    let mut annotations = op.labels().clone();
    annotations.extend(op.annotations().iter().map(|(k, v)| (k.clone(), v.clone())));
    OperationRef {
        name: op.name_any(),
        kind,
        target_version: op
            .spec
            .upgrade
            .as_ref()
            .map(|u| u.kubernetes_version.clone()),
        execution_mode: Some(
            match op.spec.execution_mode {
                ExecutionMode::Auto => "Auto",
                ExecutionMode::Controlled => "Controlled",
                ExecutionMode::DryRun => "DryRun",
            }
            .into(),
        ),
        annotations,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The query the control-plane task list sends: with a version the reader has seen, a
    /// read from the watch cache no older than it; without, a consistent read.
    #[test]
    fn control_plane_tasks_are_read_no_older_than_what_the_reader_saw() {
        let query = |rv: Option<&str>| {
            let request = kube::core::Request::new("/apis/bosun.dev/v1alpha1/nodetasks");
            let list = request
                .list(&control_plane_tasks("bosun.dev/node in (cp-1)", rv))
                .unwrap();
            list.uri().query().unwrap_or_default().to_owned()
        };
        let seen = query(Some("4711"));
        assert!(
            seen.contains("resourceVersion=4711")
                && seen.contains("resourceVersionMatch=NotOlderThan"),
            "{seen}"
        );
        assert!(
            seen.contains("labelSelector=bosun.dev%2Fnode+in+%28cp-1%29"),
            "{seen}"
        );
        for consistent in [query(None), query(Some(""))] {
            assert!(!consistent.contains("resourceVersion"), "{consistent}");
            assert!(consistent.contains("labelSelector="), "{consistent}");
        }
    }

    fn node(labels: serde_json::Value, ready: Option<&str>) -> Node {
        let conditions = match ready {
            Some(s) => {
                json!([{ "type": "MemoryPressure", "status": "False" }, { "type": "Ready", "status": s }])
            }
            None => json!([]),
        };
        serde_json::from_value(json!({
            "metadata": { "name": "n1", "labels": labels },
            "status": { "conditions": conditions }
        }))
        .unwrap()
    }

    #[test]
    fn a_node_is_ready_only_when_its_ready_condition_is_true() {
        assert!(is_ready(&node(json!({}), Some("True"))));
        assert!(!is_ready(&node(json!({}), Some("False"))));
        assert!(!is_ready(&node(json!({}), Some("Unknown"))));
        assert!(!is_ready(&node(json!({}), None)));
        assert_eq!(
            ready_condition(&node(json!({}), Some("False"))).map(|c| c.status.as_str()),
            Some("False")
        );
    }

    #[test]
    fn roles_come_from_node_role_labels_and_default_to_worker() {
        let cp = node(
            json!({ "node-role.kubernetes.io/control-plane": "", "kubernetes.io/os": "linux" }),
            None,
        );
        assert_eq!(roles_of(&cp), vec!["control-plane".to_string()]);
        assert_eq!(roles_of(&node(json!({}), None)), vec!["worker".to_string()]);
    }
}
