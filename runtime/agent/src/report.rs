//! The node's standing report: the agent keeps its node's `NodeReport` (named after the
//! node) current, outside any task, for the controller's ClusterLifecycle.
//!
//! The facts are read the same way as a task's `before`/`after` reports ([`facts::collect`]).
//! They are read once per period and written only when they differ from what the report
//! holds (the time they were read aside): on start (unless the stored report already says
//! the same), on a change, and never when nothing changed. A task of this node finishing
//! makes it look at once instead of at the end of its period. At 1,000 nodes that is one
//! write per node per change, and reads of the node's own files and its own Node object
//! once per period (default 5 minutes), which cost the API server one GET per node per
//! period.
//!
//! The API server lets an agent write only its own node's report
//! (`deploy/admission/agent-own-node.yaml`).

use std::time::Duration;

use bosun_api::node_report::NodeReport;
use bosun_api::node_task::NodeFacts;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::{Agent, Error, facts};

/// True when two reads of the facts say the same, whenever they were read.
pub fn same_facts(a: &NodeFacts, b: &NodeFacts) -> bool {
    let mut b = b.clone();
    b.collected_at = a.collected_at.clone();
    *a == b
}

/// Reads the facts and writes the report if they changed. Returns whether it wrote.
pub async fn report_once(agent: &Agent, last: &mut Option<NodeFacts>) -> Result<bool, Error> {
    let api: Api<NodeReport> = Api::all(agent.client.clone());
    if last.is_none() {
        // On start: what the report already holds (a restart changes nothing by itself).
        match api.get_opt(&agent.node_name).await {
            Ok(stored) => *last = stored.map(|r| r.spec.facts),
            Err(e) => tracing::debug!(error = %e, "cannot read this node's NodeReport; writing it"),
        }
    }
    // The facts a finished task's last read gave, when that is what woke this: read a
    // moment ago, not read again (one Node read and host look less per task).
    let now = match agent.report_now.take() {
        Some(given) => given,
        None => facts::collect(agent).await,
    };
    if last.as_ref().is_some_and(|l| same_facts(l, &now)) {
        return Ok(false);
    }
    let patch = json!({
        "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeReport",
        "metadata": { "name": agent.node_name },
        "spec": { "nodeName": agent.node_name, "facts": now },
    });
    api.patch(
        &agent.node_name,
        &PatchParams::apply(&format!("{}.report", agent.manager)).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(bosun_cluster::Error::kube(format!(
        "writing NodeReport {}",
        agent.node_name
    )))?;
    tracing::info!(
        kubelet = now.kubelet_version.as_deref().unwrap_or("?"),
        kubeadm = now.kubeadm_version.as_deref().unwrap_or("?"),
        kubectl = now.kubectl_version.as_deref().unwrap_or("-"),
        packages = now.packages.len(),
        certificates = now.certificates.len(),
        "node report written"
    );
    *last = Some(now);
    Ok(true)
}

/// Keeps the report current every `period`, and at once when a task of this node finishes
/// ([`Agent::report_now`]), until the process ends. A failed write is tried again next
/// period.
pub async fn run(agent: std::sync::Arc<Agent>, period: Duration) {
    let mut last = None;
    loop {
        if let Err(e) = report_once(&agent, &mut last).await {
            tracing::warn!(error = %e, "node report not written; trying again next period");
            last = None;
        }
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = agent.report_now.notify.notified() => {}
        }
    }
}

/// The wake-up of the standing report ([`run`]), with the facts a finished task read last,
/// if any (the report then writes those instead of reading them again).
#[derive(Debug, Default)]
pub struct ReportNow {
    notify: tokio::sync::Notify,
    facts: std::sync::Mutex<Option<NodeFacts>>,
}

impl ReportNow {
    /// Wakes the report now; with `facts`, it reports them rather than reading its own.
    pub fn wake(&self, facts: Option<NodeFacts>) {
        *self
            .facts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = facts;
        self.notify.notify_one();
    }

    /// The facts given with the last wake-up, once.
    pub fn take(&self) -> Option<NodeFacts> {
        self.facts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn facts_read_at_different_times_are_the_same_unless_a_value_changed() {
        let a = facts::assemble(Timestamp::UNIX_EPOCH, Some("v1.34.4".into()), None, vec![]);
        let mut b = facts::assemble(Timestamp::now(), Some("v1.34.4".into()), None, vec![]);
        assert!(same_facts(&a, &b));
        b.kubelet_version = Some("v1.35.0".into());
        assert!(!same_facts(&a, &b));
    }
}
