//! Draining a node through the eviction API, one non-blocking pass at a time.
//!
//! A drain is a sequence of passes, one per reconcile, so a long drain never holds up the
//! controller: each pass cordons the node (idempotent; inside the window of a cordon the
//! task made before, it checks the node is still cordoned instead, see [`pass`]), lists the
//! pods bound to it, evicts every pod that must go and is not already terminating, and
//! reports what is left. The step's `startedAt` in status is the drain's clock, so a
//! restarted controller continues the same drain with the same deadline.
//!
//! Which pods go is [`classify`] (pure): DaemonSet-owned pods and mirror (static) pods stay,
//! as `kubectl drain` leaves them; pods using emptyDir volumes or managed by no controller
//! stop the drain unless the Operation's `drain` settings allow them (their data, or the pod
//! itself, would be lost). Evictions go through the API server's PodDisruptionBudget checks:
//! a refusal (429) is tried again on the next pass until `drain.timeoutSeconds`, then the
//! drain fails as `DrainTimedOut` naming every pod still there and the budgets that hold it
//! ([`explain_leftovers`], pure).

use std::collections::BTreeMap;

use bosun_api::operation::DrainSpec;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, EvictParams, ListParams};
use kube::{Client, ResourceExt};

/// Annotation the kubelet puts on the API copy of a static pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// A pod, as `namespace/name`.
pub type PodKey = String;

/// Why a pod on the node is left alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Left {
    /// Owned by a DaemonSet: its controller would put it straight back.
    DaemonSet,
    /// A mirror pod of a static pod: only the kubelet can remove it.
    Mirror,
}

/// Why a pod stops the drain before anything is evicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Uses emptyDir volumes and `drain.deleteEmptyDirData` is false.
    EmptyDir,
    /// No controller manages it and `drain.evictUnmanagedPods` is false.
    Unmanaged,
}

/// What a pass does with the pods bound to the node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Classified {
    /// Pods to evict now.
    pub evict: Vec<PodKey>,
    /// Pods already being deleted: waited for, not evicted again.
    pub terminating: Vec<PodKey>,
    /// Pods the drain leaves alone, with why.
    pub left: Vec<(PodKey, Left)>,
    /// Pods that stop the drain, with why.
    pub refused: Vec<(PodKey, Refusal)>,
}

fn key(pod: &Pod) -> PodKey {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

/// Sorts the pods bound to a node into what a drain does with each. Pure.
pub fn classify(pods: &[Pod], spec: &DrainSpec) -> Classified {
    let mut out = Classified::default();
    for pod in pods {
        let k = key(pod);
        let controller = pod
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true));
        if pod.annotations().contains_key(MIRROR_ANNOTATION) {
            out.left.push((k, Left::Mirror));
        } else if controller.is_some_and(|o| o.kind == "DaemonSet") {
            out.left.push((k, Left::DaemonSet));
        } else if pod.metadata.deletion_timestamp.is_some() {
            out.terminating.push(k);
        } else if pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed")
        {
            // A finished pod holds nothing: evicting it just removes it.
            out.evict.push(k);
        } else if controller.is_none() && !spec.evict_unmanaged_pods {
            out.refused.push((k, Refusal::Unmanaged));
        } else if uses_empty_dir(pod) && !spec.delete_empty_dir_data {
            out.refused.push((k, Refusal::EmptyDir));
        } else {
            out.evict.push(k);
        }
    }
    out
}

fn uses_empty_dir(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|vs| vs.iter().any(|v| v.empty_dir.is_some()))
}

/// The message for pods that stop a drain before it starts: which pods, why, and the
/// setting that would allow them.
pub fn refusal_message(node: &str, refused: &[(PodKey, Refusal)]) -> String {
    let list = |r: Refusal| {
        refused
            .iter()
            .filter(|(_, x)| *x == r)
            .map(|(k, _)| k.as_str())
            .collect::<Vec<_>>()
    };
    let mut parts = Vec::new();
    let empty = list(Refusal::EmptyDir);
    if !empty.is_empty() {
        parts.push(format!(
            "pods {} use emptyDir volumes whose data an eviction deletes: set spec.drain.deleteEmptyDirData: true on a new Operation, or move them off the node",
            empty.join(", ")
        ));
    }
    let bare = list(Refusal::Unmanaged);
    if !bare.is_empty() {
        parts.push(format!(
            "pods {} are managed by no controller, so nothing would recreate them: set spec.drain.evictUnmanagedPods: true on a new Operation, or delete them yourself",
            bare.join(", ")
        ));
    }
    format!(
        "cannot drain node {node}: {}; then use recovery: Retry",
        parts.join("; ")
    )
}

/// A PodDisruptionBudget as a drain message needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct Budget {
    /// `namespace/name`.
    pub name: String,
    pub selector: Option<LabelSelector>,
    pub current_healthy: i32,
    pub desired_healthy: i32,
    pub disruptions_allowed: i32,
}

impl Budget {
    pub fn from_pdb(pdb: &PodDisruptionBudget) -> Self {
        let status = pdb.status.clone().unwrap_or_default();
        Budget {
            name: format!("{}/{}", pdb.namespace().unwrap_or_default(), pdb.name_any()),
            selector: pdb.spec.as_ref().and_then(|s| s.selector.clone()),
            current_healthy: status.current_healthy,
            desired_healthy: status.desired_healthy,
            disruptions_allowed: status.disruptions_allowed,
        }
    }

    /// True when the budget covers a pod with `labels` in the budget's namespace. As the
    /// API server reads it: an empty selector covers every pod, an absent one none.
    pub fn covers(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        self.name
            .split_once('/')
            .is_some_and(|(ns, _)| ns == namespace)
            && self
                .selector
                .as_ref()
                .is_some_and(|s| selector_matches(s, labels))
    }
}

/// Label selector semantics (matchLabels and matchExpressions In, NotIn, Exists,
/// DoesNotExist). An unknown operator matches nothing.
pub fn selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expr = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        }
    });
    by_labels && by_expr
}

/// One pod still on the node after a pass, and what holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct Leftover {
    pub pod: PodKey,
    pub held: Held,
}

/// What keeps a pod on the node.
#[derive(Clone, Debug, PartialEq)]
pub enum Held {
    /// The API server refused the eviction (429) citing a disruption budget; `budgets` are
    /// the PodDisruptionBudgets covering the pod, `detail` the API server's words.
    Budget {
        budgets: Vec<Budget>,
        detail: String,
    },
    /// Evicted or deleted, still terminating (its grace period, or no kubelet confirming).
    Terminating,
    /// The eviction call failed otherwise (tried again on the next pass).
    Error(String),
}

/// One line naming every pod left and what holds it, for status and for the timeout's
/// Blocked message. Pure.
pub fn explain_leftovers(leftovers: &[Leftover]) -> String {
    leftovers
        .iter()
        .map(|l| match &l.held {
            Held::Budget { budgets, detail } if budgets.is_empty() => format!("{} (eviction refused: {detail})", l.pod),
            Held::Budget { budgets, .. } => {
                let names: Vec<String> = budgets
                    .iter()
                    .map(|b| format!("PodDisruptionBudget {} ({} healthy, {} required, {} disruptions allowed)", b.name, b.current_healthy, b.desired_healthy, b.disruptions_allowed))
                    .collect();
                format!("{} (eviction refused by {})", l.pod, names.join(" and "))
            }
            Held::Terminating => format!("{} (terminating)", l.pod),
            Held::Error(e) => format!("{} (eviction failed: {e})", l.pod),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// What one pass found.
#[derive(Clone, Debug, PartialEq)]
pub enum Pass {
    /// No pod that must go is left on the node.
    Drained {
        evicted: Vec<PodKey>,
        left: Vec<(PodKey, Left)>,
    },
    /// Pods stop the drain before it starts (see [`refusal_message`]).
    Refused(String),
    /// Pods are still there; the next pass tries again.
    Waiting {
        evicted: Vec<PodKey>,
        leftovers: Vec<Leftover>,
    },
    /// The drain runs inside the window of the task's cordon and the node is schedulable:
    /// someone else uncordoned it. Nothing was evicted and the node was not cordoned again
    /// (see [`bosun_cluster::cordon`]).
    Uncordoned,
}

/// One drain pass over `node`: cordon, list, evict, list again. Errors are the API calls
/// that failed before any eviction (listing pods, cordoning); they are tried again next pass.
/// `task` is the NodeTask's name, recorded with the cordon.
///
/// `within_cordon`: the drain runs inside the window of the task's cordon (an earlier step
/// cordoned the node, see [`bosun_cluster::cordon::cordon_window`]). Then the pass does not
/// cordon the node itself: it reads the Node and, if it is schedulable, stops at once with
/// [`Pass::Uncordoned`]. Cordoning it again would hide that someone else cleared the cordon,
/// and pods may have come back since.
pub async fn pass(
    client: &Client,
    node: &str,
    task: &str,
    spec: &DrainSpec,
    within_cordon: bool,
) -> Result<Pass, String> {
    if within_cordon {
        if !still_cordoned(client, node).await? {
            return Ok(Pass::Uncordoned);
        }
    } else {
        crate::actions::set_unschedulable(client, node, true, task, None)
            .await
            .map_err(|e| e.message)?;
    }
    let pods = pods_on(client, node).await?;
    let sorted = classify(&pods, spec);
    if !sorted.refused.is_empty() {
        return Ok(Pass::Refused(refusal_message(node, &sorted.refused)));
    }
    let (evicted, mut held) = evict(client, &pods, &sorted.evict).await;
    if !evicted.is_empty() {
        tracing::info!(%node, pods = ?evicted, "evicted");
    }
    // Look again: pods with no grace period are gone already, the rest are terminating.
    let after = classify(&pods_on(client, node).await?, spec);
    if !after.refused.is_empty() {
        // A pod that appeared after the first look (the node is cordoned, but a pod can
        // still be bound to it directly).
        return Ok(Pass::Refused(refusal_message(node, &after.refused)));
    }
    let leftovers: Vec<Leftover> = after
        .evict
        .into_iter()
        .map(|pod| {
            let held = held.remove(&pod).unwrap_or(Held::Terminating);
            Leftover { pod, held }
        })
        .chain(after.terminating.into_iter().map(|pod| Leftover {
            pod,
            held: Held::Terminating,
        }))
        .collect();
    if leftovers.is_empty() {
        Ok(Pass::Drained {
            evicted,
            left: after.left,
        })
    } else {
        Ok(Pass::Waiting { evicted, leftovers })
    }
}

/// Whether `node` is cordoned now, read from the API server.
async fn still_cordoned(client: &Client, node: &str) -> Result<bool, String> {
    let nodes: Api<Node> = Api::all(client.clone());
    let current = nodes
        .get_opt(node)
        .await
        .map_err(|e| format!("reading node {node}: {e}"))?
        .ok_or_else(|| format!("node {node} does not exist"))?;
    Ok(current
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false))
}

/// The pods bound to `node`.
async fn pods_on(client: &Client, node: &str) -> Result<Vec<Pod>, String> {
    let pods_api: Api<Pod> = Api::all(client.clone());
    let on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
    Ok(pods_api
        .list(&on_node)
        .await
        .map_err(|e| format!("listing the pods on node {node}: {e}"))?
        .items)
}

/// Asks the API server to evict each of `keys` (from `pods`): the ones it evicted (or that
/// were gone already), and why the others are held (a PodDisruptionBudget, or an error).
async fn evict(
    client: &Client,
    pods: &[Pod],
    keys: &[PodKey],
) -> (Vec<PodKey>, BTreeMap<PodKey, Held>) {
    let mut evicted = Vec::new();
    let mut held: BTreeMap<PodKey, Held> = BTreeMap::new();
    for pod_key in keys {
        let (ns, name) = pod_key.split_once('/').unwrap_or(("", pod_key));
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        match api.evict(name, &EvictParams::default()).await {
            Ok(_) => evicted.push(pod_key.clone()),
            Err(kube::Error::Api(s)) if s.code == 404 => evicted.push(pod_key.clone()),
            Err(kube::Error::Api(s)) if s.code == 429 => {
                let pod = pods.iter().find(|p| key(p) == *pod_key);
                let labels = pod.map(|p| p.labels().clone()).unwrap_or_default();
                let budgets = budgets_covering(client, ns, &labels).await;
                let causes: Vec<String> = s
                    .details
                    .iter()
                    .flat_map(|d| d.causes.iter())
                    .map(|c| c.message.clone())
                    .filter(|m| !m.is_empty())
                    .collect();
                let detail = if causes.is_empty() {
                    s.message.clone()
                } else {
                    causes.join("; ")
                };
                held.insert(pod_key.clone(), Held::Budget { budgets, detail });
            }
            Err(e) => {
                held.insert(pod_key.clone(), Held::Error(e.to_string()));
            }
        }
    }
    (evicted, held)
}

/// The PodDisruptionBudgets in `namespace` covering a pod with `labels`, for the message.
/// A failure to list them only makes the message poorer.
async fn budgets_covering(
    client: &Client,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Vec<Budget> {
    let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), namespace);
    match api.list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .iter()
            .map(Budget::from_pdb)
            .filter(|b| b.covers(namespace, labels))
            .collect(),
        Err(error) => {
            tracing::warn!(%error, namespace, "could not list PodDisruptionBudgets to explain a refused eviction");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, PodSpec, PodStatus, Volume};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        LabelSelectorRequirement, ObjectMeta, OwnerReference, Time,
    };

    fn pod(name: &str, owner_kind: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                owner_references: owner_kind.map(|k| {
                    vec![OwnerReference {
                        api_version: "apps/v1".into(),
                        kind: k.into(),
                        name: "o".into(),
                        uid: "u".into(),
                        controller: Some(true),
                        block_owner_deletion: None,
                    }]
                }),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                ..Default::default()
            }),
        }
    }

    fn spec(empty_dir: bool, unmanaged: bool) -> DrainSpec {
        DrainSpec {
            delete_empty_dir_data: empty_dir,
            evict_unmanaged_pods: unmanaged,
            ..DrainSpec::default()
        }
    }

    #[test]
    fn daemonset_and_mirror_pods_stay_and_managed_pods_go() {
        let mut mirror = pod("kube-apiserver-n1", None);
        mirror.metadata.annotations =
            Some([(MIRROR_ANNOTATION.to_string(), "abc".to_string())].into());
        let pods = [
            pod("web-1", Some("ReplicaSet")),
            pod("agent-x", Some("DaemonSet")),
            mirror,
            pod("db-0", Some("StatefulSet")),
        ];
        let c = classify(&pods, &spec(false, false));
        assert_eq!(c.evict, ["ns/web-1", "ns/db-0"]);
        assert_eq!(
            c.left,
            [
                ("ns/agent-x".to_string(), Left::DaemonSet),
                ("ns/kube-apiserver-n1".to_string(), Left::Mirror)
            ]
        );
        assert!(c.refused.is_empty() && c.terminating.is_empty());
    }

    #[test]
    fn a_non_controller_owner_does_not_make_a_pod_managed() {
        let mut p = pod("loose", Some("ReplicaSet"));
        p.metadata.owner_references.as_mut().unwrap()[0].controller = Some(false);
        assert_eq!(
            classify(&[p.clone()], &spec(false, false)).refused,
            [("ns/loose".to_string(), Refusal::Unmanaged)]
        );
        assert_eq!(classify(&[p], &spec(false, true)).evict, ["ns/loose"]);
    }

    #[test]
    fn emptydir_and_bare_pods_stop_the_drain_unless_allowed() {
        let mut scratch = pod("scratch", Some("ReplicaSet"));
        scratch.spec.as_mut().unwrap().volumes = Some(vec![Volume {
            name: "tmp".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Default::default()
        }]);
        let bare = pod("bare", None);
        let pods = [scratch, bare];
        let c = classify(&pods, &spec(false, false));
        assert_eq!(
            c.refused,
            [
                ("ns/scratch".to_string(), Refusal::EmptyDir),
                ("ns/bare".to_string(), Refusal::Unmanaged)
            ]
        );
        assert!(c.evict.is_empty());
        let m = refusal_message("n1", &c.refused);
        assert!(
            m.contains("ns/scratch")
                && m.contains("deleteEmptyDirData")
                && m.contains("ns/bare")
                && m.contains("evictUnmanagedPods"),
            "{m}"
        );
        assert_eq!(
            classify(&pods, &spec(true, true)).evict,
            ["ns/scratch", "ns/bare"]
        );
    }

    #[test]
    fn terminating_pods_are_waited_for_and_finished_pods_are_evicted_even_if_bare() {
        let mut going = pod("going", Some("ReplicaSet"));
        going.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let mut done = pod("job-done", None);
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let c = classify(&[going, done], &spec(false, false));
        assert_eq!(c.terminating, ["ns/going"]);
        assert_eq!(c.evict, ["ns/job-done"]);
        assert!(c.refused.is_empty());
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selectors_match_as_the_api_server_reads_them() {
        let l = labels(&[("app", "web"), ("tier", "front")]);
        let sel = |ml: &[(&str, &str)], ex: Vec<(&str, &str, Vec<&str>)>| LabelSelector {
            match_labels: Some(labels(ml)),
            match_expressions: Some(
                ex.into_iter()
                    .map(|(k, op, vs)| LabelSelectorRequirement {
                        key: k.into(),
                        operator: op.into(),
                        values: Some(vs.into_iter().map(String::from).collect()),
                    })
                    .collect(),
            ),
        };
        assert!(selector_matches(&sel(&[("app", "web")], vec![]), &l));
        assert!(!selector_matches(&sel(&[("app", "db")], vec![]), &l));
        assert!(selector_matches(
            &sel(&[], vec![("tier", "In", vec!["front", "back"])]),
            &l
        ));
        assert!(!selector_matches(
            &sel(&[], vec![("tier", "NotIn", vec!["front"])]),
            &l
        ));
        assert!(selector_matches(
            &sel(&[], vec![("zone", "DoesNotExist", vec![])]),
            &l
        ));
        assert!(!selector_matches(
            &sel(&[], vec![("zone", "Exists", vec![])]),
            &l
        ));
        assert!(!selector_matches(
            &sel(&[], vec![("tier", "Bogus", vec![])]),
            &l
        ));
        assert!(
            selector_matches(&LabelSelector::default(), &l),
            "an empty selector covers every pod"
        );
    }

    #[test]
    fn a_budget_covers_pods_of_its_own_namespace_only() {
        let b = Budget {
            name: "ns/web-pdb".into(),
            selector: Some(LabelSelector {
                match_labels: Some(labels(&[("app", "web")])),
                match_expressions: None,
            }),
            current_healthy: 1,
            desired_healthy: 1,
            disruptions_allowed: 0,
        };
        assert!(b.covers("ns", &labels(&[("app", "web")])));
        assert!(!b.covers("other", &labels(&[("app", "web")])));
        let none = Budget {
            selector: None,
            ..b
        };
        assert!(
            !none.covers("ns", &labels(&[("app", "web")])),
            "an absent selector covers nothing"
        );
    }

    #[test]
    fn leftovers_name_each_pod_and_the_budgets_holding_it() {
        let b = Budget {
            name: "ns/web-pdb".into(),
            selector: None,
            current_healthy: 1,
            desired_healthy: 1,
            disruptions_allowed: 0,
        };
        let text = explain_leftovers(&[
            Leftover {
                pod: "ns/web-1".into(),
                held: Held::Budget {
                    budgets: vec![b],
                    detail: "x".into(),
                },
            },
            Leftover {
                pod: "ns/web-2".into(),
                held: Held::Terminating,
            },
            Leftover {
                pod: "ns/odd".into(),
                held: Held::Budget {
                    budgets: vec![],
                    detail: "Cannot evict pod as it would violate the pod's disruption budget."
                        .into(),
                },
            },
        ]);
        assert_eq!(
            text,
            "ns/web-1 (eviction refused by PodDisruptionBudget ns/web-pdb (1 healthy, 1 required, 0 disruptions allowed)); ns/web-2 (terminating); ns/odd (eviction refused: Cannot evict pod as it would violate the pod's disruption budget.)"
        );
    }
}
