//! The ClusterLifecycle reconciler: the declarative layer on top of Operations.
//!
//! Once per period it reads the ClusterLifecycle `cluster`, the Nodes, the NodeReports
//! and the Operations it generated (by label), asks [`decide::decide`] what to do, creates
//! at most one Operation, and writes the status when it changed. Operations stay the
//! imperative layer: a generated Operation is an ordinary one (planned, gated by policies,
//! held behind another Operation's tasks on the same node) that carries the label
//! [`labels::LIFECYCLE`] instead of an ownerReference, so deleting the ClusterLifecycle
//! deletes no Operation, and the reconciler never deletes one either.
//!
//! Adoption: when the controller starts and there is no ClusterLifecycle, it creates one
//! from what the cluster is (the version in kube-system's `kubeadm-config` ConfigMap,
//! `autoRenew` off), which therefore generates nothing. It adopts once per process: a
//! ClusterLifecycle deleted later is not recreated until the controller restarts.

pub mod decide;

use std::collections::BTreeMap;
use std::time::Duration;

use bosun_api::labels;
use bosun_api::lifecycle::{
    ClusterLifecycle, ClusterLifecycleStatus, GeneratedOperation, MAX_HISTORY, NAME,
};
use bosun_api::node_report::NodeReport;
use bosun_api::operation::Operation;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::error::{Error, Result};
use crate::time::set_condition;
use decide::{Decision, Generated, Input, Kind, NodeObservation, decide};

/// The label every control-plane node carries.
const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// What the reconciler needs.
#[derive(Clone)]
pub struct Lifecycle {
    pub client: Client,
    pub manager: String,
    pub instance: Option<String>,
}

/// Runs the reconciler every `period` until the process ends. Errors are logged and the
/// next pass tries again.
pub async fn run(lifecycle: Lifecycle, period: Duration) {
    let mut adoption = Adoption::default();
    loop {
        match lifecycle.pass(&mut adoption).await {
            Ok(()) => {}
            Err(e) => tracing::warn!(error = %e, "ClusterLifecycle reconcile failed; trying again"),
        }
        tokio::time::sleep(period).await;
    }
}

impl std::fmt::Debug for Lifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lifecycle")
            .field("manager", &self.manager)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

/// Where adoption stands in this process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Adoption {
    /// A ClusterLifecycle was seen or created: never adopt again in this process.
    pub done: bool,
    /// The "nothing to adopt" warning was logged (once, not every pass).
    pub warned: bool,
}

impl Lifecycle {
    fn ours(&self, object: &ClusterLifecycle) -> bool {
        object.labels().get(labels::INSTANCE).map(String::as_str) == self.instance.as_deref()
    }

    /// One pass: adopt (once) or reconcile.
    pub async fn pass(&self, adoption: &mut Adoption) -> Result<()> {
        let api: Api<ClusterLifecycle> = Api::all(self.client.clone());
        let Some(object) = api
            .get_opt(NAME)
            .await
            .map_err(Error::kube("getting ClusterLifecycle cluster"))?
        else {
            if !adoption.done {
                adoption.done = self.adopt(&api, adoption.warned).await?;
                adoption.warned = true;
            }
            return Ok(());
        };
        adoption.done = true;
        if !self.ours(&object) {
            tracing::debug!("ClusterLifecycle cluster belongs to another instance; left alone");
            return Ok(());
        }
        if object.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        self.reconcile(&object).await
    }

    /// Creates the ClusterLifecycle from the cluster as it is. `Ok(false)` when the cluster
    /// does not say its version (no kubeadm-config ConfigMap): try again next pass.
    async fn adopt(&self, api: &Api<ClusterLifecycle>, warned: bool) -> Result<bool> {
        let maps: Api<ConfigMap> = Api::namespaced(self.client.clone(), "kube-system");
        let map = maps
            .get_opt("kubeadm-config")
            .await
            .map_err(Error::kube("getting ConfigMap kube-system/kubeadm-config"))?;
        let version = map
            .as_ref()
            .and_then(|m| m.data.as_ref())
            .and_then(|d| d.get("ClusterConfiguration"))
            .and_then(|c| kubernetes_version_of(c));
        let Some(version) = version else {
            if warned {
                return Ok(false);
            }
            tracing::warn!(
                "no ClusterLifecycle, and ConfigMap kube-system/kubeadm-config has no ClusterConfiguration with a kubernetesVersion: nothing to adopt yet (create the ClusterLifecycle by hand, or check the cluster was made by kubeadm)"
            );
            return Ok(false);
        };
        let mut metadata = json!({ "name": NAME });
        if let Some(instance) = &self.instance {
            metadata["labels"] = json!({ labels::INSTANCE: instance });
        }
        let object: ClusterLifecycle = serde_json::from_value(json!({
            "apiVersion": "bosun.dev/v1alpha1", "kind": "ClusterLifecycle",
            "metadata": metadata,
            "spec": {
                "kubernetesVersion": version,
                "certificates": { "autoRenew": false },
            },
        }))
        .map_err(|source| Error::Serialize {
            what: "ClusterLifecycle",
            source,
        })?;
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => {
                tracing::info!(%version, "adopted the cluster: created ClusterLifecycle cluster")
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(Error::kube("creating ClusterLifecycle cluster")(e)),
        }
        Ok(true)
    }

    async fn reconcile(&self, object: &ClusterLifecycle) -> Result<()> {
        let now = Timestamp::now();
        let nodes = self.observe().await?;
        let generated_ops = self.generated().await?;
        let generated: Vec<Generated> = generated_ops
            .iter()
            .filter_map(|op| {
                let kind = if op.spec.upgrade.is_some() {
                    Kind::Upgrade
                } else if op.spec.renew_certificates.is_some() {
                    Kind::RenewCertificates
                } else {
                    return None;
                };
                let status = op.status.clone().unwrap_or_default();
                Some(Generated {
                    name: op.name_any(),
                    kind,
                    phase: status.phase,
                    progress: status.progress,
                })
            })
            .collect();
        let stored = object.status.clone().unwrap_or_default();
        let decision = decide(&Input {
            spec: &object.spec,
            handled_rotation: stored.certificates.handled_rotation,
            nodes: &nodes,
            generated: &generated,
            now,
        });
        let mut history = stored.history.clone();
        if let Some(g) = &decision.generate {
            self.create_operation(g).await?;
            if !history.iter().any(|h| h.name == g.name) {
                history.insert(
                    0,
                    GeneratedOperation {
                        name: g.name.clone(),
                        kind: g.kind.as_str().into(),
                        reason: g.reason.clone(),
                        created_at: Time(now),
                    },
                );
                history.truncate(MAX_HISTORY);
            }
        }
        let status = status_of(object, &stored, &decision, history, now);
        if status != stored {
            self.write_status(&status).await?;
        }
        Ok(())
    }

    /// Every Node with its kubelet version, and the certificates of its NodeReport.
    async fn observe(&self) -> Result<Vec<NodeObservation>> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let reports: Api<NodeReport> = Api::all(self.client.clone());
        let nodes = nodes
            .list(&ListParams::default())
            .await
            .map_err(Error::kube("listing Nodes"))?;
        let reports: BTreeMap<String, NodeReport> = reports
            .list(&ListParams::default())
            .await
            .map_err(Error::kube("listing NodeReports"))?
            .items
            .into_iter()
            .map(|r| (r.spec.node_name.clone(), r))
            .collect();
        Ok(nodes
            .items
            .iter()
            .map(|n| {
                let name = n.name_any();
                NodeObservation {
                    control_plane: n.labels().contains_key(CONTROL_PLANE_LABEL),
                    kubelet_version: n
                        .status
                        .as_ref()
                        .and_then(|s| s.node_info.as_ref())
                        .map(|i| i.kubelet_version.clone())
                        .filter(|v| !v.is_empty()),
                    certificates: reports
                        .get(&name)
                        .map(|r| r.spec.facts.certificates.clone()),
                    name,
                }
            })
            .collect())
    }

    /// The Operations this install's ClusterLifecycle generated, by label.
    async fn generated(&self) -> Result<Vec<Operation>> {
        let ops: Api<Operation> = Api::all(self.client.clone());
        let selector = format!(
            "{},{}",
            bosun_cluster::instance_selector(self.instance.as_deref()),
            labels::LIFECYCLE
        );
        Ok(ops
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(Error::kube("listing generated Operations"))?
            .items)
    }

    async fn create_operation(&self, g: &decide::Generate) -> Result<()> {
        let mut labels_ =
            BTreeMap::from([(labels::LIFECYCLE.to_string(), g.kind.as_str().to_string())]);
        if let Some(instance) = &self.instance {
            labels_.insert(labels::INSTANCE.into(), instance.clone());
        }
        let mut op = Operation::new(&g.name, g.spec.clone());
        op.metadata.labels = Some(labels_);
        op.metadata.annotations = Some(BTreeMap::from([(
            labels::annotations::LIFECYCLE_REASON.to_string(),
            g.reason.clone(),
        )]));
        let ops: Api<Operation> = Api::all(self.client.clone());
        match ops.create(&PostParams::default(), &op).await {
            Ok(_) => {
                tracing::info!(operation = %g.name, reason = %g.reason, "ClusterLifecycle generated an Operation");
                Ok(())
            }
            // Created by an earlier pass whose status write was lost: the same Operation.
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(Error::kube(format!("creating Operation {}", g.name))(e)),
        }
    }

    async fn write_status(&self, status: &ClusterLifecycleStatus) -> Result<()> {
        let api: Api<ClusterLifecycle> = Api::all(self.client.clone());
        let status = serde_json::to_value(status).map_err(|source| Error::Serialize {
            what: "ClusterLifecycle status",
            source,
        })?;
        let patch = json!({ "apiVersion": "bosun.dev/v1alpha1", "kind": "ClusterLifecycle", "metadata": { "name": NAME }, "status": status });
        api.patch_status(
            NAME,
            &PatchParams::apply(&self.manager).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(Error::kube(
            "writing the status of ClusterLifecycle cluster",
        ))?;
        Ok(())
    }
}

/// The status to write for `decision`. Conditions keep their transition times while their
/// status holds, so an unchanged cluster writes an unchanged status (and nothing is sent).
fn status_of(
    object: &ClusterLifecycle,
    stored: &ClusterLifecycleStatus,
    d: &Decision,
    history: Vec<GeneratedOperation>,
    now: Timestamp,
) -> ClusterLifecycleStatus {
    let generation = object.metadata.generation;
    let mut status = ClusterLifecycleStatus {
        conditions: stored.conditions.clone(),
        waiting: d.waiting.as_ref().map(|w| w.0.as_str().to_string()),
        summary: Some(d.summary.clone()),
        versions: d.versions.clone(),
        certificates: d.certificates.clone(),
        current_operation: d
            .generate
            .as_ref()
            .map(|g| g.name.clone())
            .or_else(|| d.progressing.clone()),
        history,
        observed_generation: generation,
    };
    let (in_sync, reason, message) = &d.in_sync;
    set_condition(
        &mut status.conditions,
        "InSync",
        *in_sync,
        reason,
        message,
        generation,
        now,
    );
    let (progressing, reason, message) = match (&d.generate, &d.progressing, &d.waiting) {
        (Some(g), _, _) => (
            true,
            "Generated",
            format!("generated {}: {}", g.name, g.reason),
        ),
        (None, Some(name), Some((w, what))) => (true, w.as_str(), format!("{name}: {what}")),
        (None, Some(name), None) => (true, "OperationRunning", name.clone()),
        (None, None, Some((w, what))) => (false, w.as_str(), what.clone()),
        (None, None, None) => (false, "Idle", String::new()),
    };
    set_condition(
        &mut status.conditions,
        "Progressing",
        progressing,
        reason,
        &message,
        generation,
        now,
    );
    status
}

/// `kubernetesVersion` from kubeadm's ClusterConfiguration (a YAML document): the value of
/// the top-level `kubernetesVersion:` line, quotes removed.
pub fn kubernetes_version_of(cluster_configuration: &str) -> Option<String> {
    cluster_configuration.lines().find_map(|line| {
        let value = line.strip_prefix("kubernetesVersion:")?.trim();
        let value = value.trim_matches(|c| c == '"' || c == '\'');
        bosun_api::lifecycle::parse_version(value).map(|_| value.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_read_from_kubeadms_cluster_configuration() {
        let config = "apiServer: {}\napiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: v1.34.4\nnetworking:\n  podSubnet: 10.244.0.0/16\n";
        assert_eq!(kubernetes_version_of(config).as_deref(), Some("v1.34.4"));
        assert_eq!(
            kubernetes_version_of("kubernetesVersion: \"v1.33.1\"\n").as_deref(),
            Some("v1.33.1")
        );
        assert_eq!(kubernetes_version_of("kubernetesVersion: stable\n"), None);
        assert_eq!(kubernetes_version_of("kind: ClusterConfiguration\n"), None);
    }
}
