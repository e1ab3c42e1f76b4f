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
//! (`deploy/admission/agent-own-node.yaml`), but anyone with RBAC on `nodereports` (an
//! administrator, a controller given too much) can change or delete it. So the agent also
//! watches its own report (one object, by name) and, when it holds other facts than the
//! agent last wrote or is deleted, writes it again at once from the node's own files, with
//! a Warning Event `NodeReportRestored` naming who changed it ([`guard`]). The restore reads
//! the facts again rather than rewriting the last ones, so a report changed because the node
//! really changed is corrected to the node, not to the past.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bosun_api::node_report::NodeReport;
use bosun_api::node_task::NodeFacts;
use futures::StreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use serde_json::json;

use crate::{Agent, Error, facts};

/// True when two reads of the facts say the same, whenever they were read.
pub fn same_facts(a: &NodeFacts, b: &NodeFacts) -> bool {
    let mut b = b.clone();
    b.collected_at = a.collected_at.clone();
    *a == b
}

/// The field manager of the agent's report writes (the guard tells them from others' by it).
fn manager_of(agent: &Agent) -> String {
    format!("{}.report", agent.manager)
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
        &PatchParams::apply(&manager_of(agent)).force(),
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
    let ours: Arc<Mutex<Option<NodeFacts>>> = Arc::default();
    let changed = Arc::new(tokio::sync::Notify::new());
    let _guard = bosun_cluster::watch::AbortOnDrop(tokio::spawn(guard(
        agent.clone(),
        ours.clone(),
        changed.clone(),
    )));
    let mut last = None;
    loop {
        if let Err(e) = report_once(&agent, &mut last).await {
            tracing::warn!(error = %e, "node report not written; trying again next period");
            last = None;
        }
        *ours.lock().unwrap_or_else(PoisonError::into_inner) = last.clone();
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = agent.report_now.notify.notified() => {}
            // Someone else changed or deleted the report: forget what it held, so that the
            // next pass reads it and the node again and writes what the node says.
            () = changed.notified() => last = None,
        }
    }
}

/// What an event about this node's own report means for the agent that keeps it.
#[derive(Debug, PartialEq, Eq)]
pub enum Seen {
    /// What the agent wrote (or found and kept), or nothing known yet to compare with.
    Ours,
    /// Someone else changed it: the managers that wrote it other than the agent.
    Changed(Vec<String>),
    /// It was deleted.
    Deleted,
}

/// Judges one event of the report watch against `ours`, the facts the agent last wrote
/// (`None` before its first pass: nothing to compare with). `manager` is the agent's field
/// manager for the report.
pub fn judge(
    event: &watcher::Event<NodeReport>,
    ours: Option<&NodeFacts>,
    node: &str,
    manager: &str,
) -> Seen {
    match event {
        watcher::Event::Delete(_) => Seen::Deleted,
        watcher::Event::Apply(report) | watcher::Event::InitApply(report) => {
            let Some(ours) = ours else {
                return Seen::Ours;
            };
            if report.spec.node_name == node && same_facts(ours, &report.spec.facts) {
                return Seen::Ours;
            }
            let mut others: Vec<String> = report
                .metadata
                .managed_fields
                .iter()
                .flatten()
                .filter_map(|f| f.manager.clone())
                .filter(|m| m != manager)
                .collect();
            others.sort();
            others.dedup();
            Seen::Changed(others)
        }
        watcher::Event::Init | watcher::Event::InitDone => Seen::Ours,
    }
}

/// Watches this node's NodeReport (by name: one object) and wakes [`run`] through
/// `changed` when someone else changed or deleted it, with a log line and a Warning Event
/// `NodeReportRestored` on the report. Runs until aborted.
async fn guard(
    agent: Arc<Agent>,
    ours: Arc<Mutex<Option<NodeFacts>>>,
    changed: Arc<tokio::sync::Notify>,
) {
    let api: Api<NodeReport> = Api::all(agent.client.clone());
    let config = watcher::Config::default().fields(&format!("metadata.name={}", agent.node_name));
    let manager = manager_of(&agent);
    // The project's watch backoff (quick again after an API-server restart, jittered per
    // node), as every other watch of the agent.
    let events = kube::runtime::WatchStreamExt::backoff(
        watcher(api, config),
        bosun_cluster::watch::WatchBackoff::new(bosun_cluster::watch::seed_of(&format!(
            "{}/report",
            agent.node_name
        ))),
    );
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                tracing::debug!(error = %e, "watch of this node's NodeReport failed; opening it again");
                continue;
            }
        };
        let ours_now = ours.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let note = match judge(&event, ours_now.as_ref(), &agent.node_name, &manager) {
            Seen::Ours => continue,
            Seen::Deleted => format!(
                "NodeReport {} was deleted; the agent writes it again from the node",
                agent.node_name
            ),
            Seen::Changed(by) => format!(
                "NodeReport {} was changed by {} to facts the node does not have; the agent writes it again from the node",
                agent.node_name,
                if by.is_empty() {
                    "someone other than this agent".to_string()
                } else {
                    by.join(", ")
                }
            ),
        };
        tracing::warn!("{note}");
        changed.notify_one();
        if let watcher::Event::Apply(report)
        | watcher::Event::InitApply(report)
        | watcher::Event::Delete(report) = &event
        {
            agent
                .events()
                .publish(
                    report,
                    &bosun_cluster::events::Notice::warning("NodeReportRestored", "Report", note),
                )
                .await;
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

    fn report(node: &str, facts: NodeFacts, managers: &[&str]) -> NodeReport {
        let mut r = NodeReport::new(
            node,
            bosun_api::node_report::NodeReportSpec {
                node_name: node.into(),
                facts,
            },
        );
        r.metadata.managed_fields = Some(
            managers
                .iter()
                .map(
                    |m| k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry {
                        manager: Some((*m).into()),
                        ..Default::default()
                    },
                )
                .collect(),
        );
        r
    }

    #[test]
    fn a_report_someone_else_changed_or_deleted_is_told_apart_from_the_agents_own() {
        let mine = "bosun-agent.report";
        let ours = facts::assemble(Timestamp::UNIX_EPOCH, Some("v1.34.4".into()), None, vec![]);
        // Our own write, read back later: ours, whenever it was read.
        let echoed = facts::assemble(Timestamp::now(), Some("v1.34.4".into()), None, vec![]);
        let own = watcher::Event::Apply(report("n1", echoed, &[mine]));
        assert_eq!(judge(&own, Some(&ours), "n1", mine), Seen::Ours);
        // Before the first pass there is nothing to compare with.
        assert_eq!(judge(&own, None, "n1", mine), Seen::Ours);

        let mut forged = ours.clone();
        forged.kubelet_version = Some("v1.99.0".into());
        for event in [
            watcher::Event::Apply(report(
                "n1",
                forged.clone(),
                &[mine, "kubectl-edit", "kubectl-edit"],
            )),
            watcher::Event::InitApply(report("n1", forged.clone(), &["kubectl-edit", mine])),
        ] {
            assert_eq!(
                judge(&event, Some(&ours), "n1", mine),
                Seen::Changed(vec!["kubectl-edit".into()])
            );
        }
        // The same facts under another node's name are not the agent's report either.
        let renamed = {
            let mut r = report("n1", ours.clone(), &[mine]);
            r.spec.node_name = "n2".into();
            r
        };
        assert_eq!(
            judge(&watcher::Event::Apply(renamed), Some(&ours), "n1", mine),
            Seen::Changed(vec![])
        );
        assert_eq!(
            judge(
                &watcher::Event::Delete(report("n1", ours.clone(), &[mine])),
                Some(&ours),
                "n1",
                mine
            ),
            Seen::Deleted
        );
        assert_eq!(
            judge(&watcher::Event::InitDone, Some(&ours), "n1", mine),
            Seen::Ours
        );
    }

    #[test]
    fn facts_read_at_different_times_are_the_same_unless_a_value_changed() {
        let a = facts::assemble(Timestamp::UNIX_EPOCH, Some("v1.34.4".into()), None, vec![]);
        let mut b = facts::assemble(Timestamp::now(), Some("v1.34.4".into()), None, vec![]);
        assert!(same_facts(&a, &b));
        b.kubelet_version = Some("v1.35.0".into());
        assert!(!same_facts(&a, &b));
    }
}
