//! Health gates: what must hold after a node's steps before the task counts as Succeeded
//! (and so before the rollout moves on to the next node).
//!
//! The gates are the Operation's `healthGates`: the node reports Ready, the API server answers
//! `/readyz`, a control-plane node's own static Pods are Ready (and restarted, after a
//! `restart-control-plane` step: the `/readyz` above may come from another control plane),
//! then `settleSeconds` more with all still true; a gate that does not pass within
//! `timeoutSeconds` blocks the task as `HealthGateFailed` with the reason. Waiting never
//! blocks a reconcile: each pass checks once, records where the gates stand in the task's
//! `HealthGates` condition (only when it changed) and asks to be looked at again. The
//! condition that says the gates `Passed` is carried by the write that moves the task to
//! Succeeded (see `reconcile::advance_running_task`).
//!
//! The condition is the gates' clock, so a restarted controller keeps the same deadline:
//! reason `Waiting` (its `lastTransitionTime` is when waiting began), `Settling` (when the
//! gates passed), `Passed`, or `Failed`. A task that is running again after a
//! `HealthGateFailed` block (recovery: Retry) starts a fresh wait. If a gate fails again while
//! settling, the wait starts over: settling means "healthy for `settleSeconds` in a row".

use std::time::Duration;

use bosun_api::node_task::NodeTask;
use bosun_api::operation::HealthGates;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::error::{Error, Result};

/// The NodeTask condition type the gates are recorded in.
pub const CONDITION: &str = "HealthGates";

/// Condition reasons.
pub mod reasons {
    pub const WAITING: &str = "Waiting";
    pub const SETTLING: &str = "Settling";
    pub const PASSED: &str = "Passed";
    pub const FAILED: &str = "Failed";
}

/// How often a gate that is not passing yet is checked again.
pub const RECHECK: Duration = Duration::from_secs(2);

/// What the gates say now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every gate passed and the settle time is over: the task may succeed.
    Pass,
    /// Look again after this long.
    Wait(Duration),
    /// The gates did not pass in time; block the task with this message.
    Fail(String),
}

/// Decides from the checks made now (`Err` says which gate failed and why), the condition
/// written by the last pass, and the time. Returns the condition to record and the verdict.
/// Pure.
pub fn judge(
    gates: &HealthGates,
    checks: Result<(), String>,
    prior: Option<&Condition>,
    generation: Option<i64>,
    now: Timestamp,
) -> (Condition, Verdict) {
    let prior_reason = prior.map(|c| c.reason.as_str());
    let condition = |status: bool, reason: &str, since: Timestamp, message: String| Condition {
        type_: CONDITION.to_string(),
        status: if status { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message,
        last_transition_time: Time(since),
        observed_generation: generation,
    };
    let since_prior = |reasons: &[&str]| match prior {
        Some(c) if reasons.contains(&c.reason.as_str()) => c.last_transition_time.0,
        _ => now,
    };
    match checks {
        Ok(()) => {
            let passed_at = since_prior(&[reasons::SETTLING, reasons::PASSED]);
            let settle = Duration::from_secs(u64::from(gates.settle_seconds));
            let elapsed = duration_between(passed_at, now);
            if elapsed >= settle {
                let c = condition(
                    true,
                    reasons::PASSED,
                    passed_at,
                    "every health gate passed".to_string(),
                );
                (c, Verdict::Pass)
            } else {
                let until = passed_at + settle;
                let c = condition(
                    true,
                    reasons::SETTLING,
                    passed_at,
                    format!(
                        "health gates passed; settling for {}s, until {until}",
                        gates.settle_seconds
                    ),
                );
                (
                    c,
                    Verdict::Wait((settle - elapsed).max(Duration::from_secs(1))),
                )
            }
        }
        Err(why) => {
            // A fresh wait unless the last pass was already waiting (a Failed condition on a
            // running task means a person chose to retry).
            let started = if prior_reason == Some(reasons::WAITING) {
                since_prior(&[reasons::WAITING])
            } else {
                now
            };
            let timeout = Duration::from_secs(u64::from(gates.timeout_seconds));
            let elapsed = duration_between(started, now);
            if elapsed >= timeout {
                let message = format!(
                    "health gates did not pass within {}s: {why}; fix the cause, then recovery: Retry (waits again) or Skip",
                    gates.timeout_seconds
                );
                (
                    condition(false, reasons::FAILED, now, message.clone()),
                    Verdict::Fail(message),
                )
            } else {
                let until = started + timeout;
                // No elapsed counter in the message: a write per pass would wake the
                // controller again at once.
                let c = condition(
                    false,
                    reasons::WAITING,
                    started,
                    format!("waiting until {until}: {why}"),
                );
                (c, Verdict::Wait(RECHECK.min(timeout - elapsed)))
            }
        }
    }
}

fn duration_between(earlier: Timestamp, later: Timestamp) -> Duration {
    let d = later.duration_since(earlier);
    Duration::try_from(d).unwrap_or(Duration::ZERO)
}

/// Whether `node` reports Ready; `Err` says what it reports instead.
pub async fn node_ready(client: &Client, node: &str) -> Result<(), String> {
    let nodes: Api<Node> = Api::all(client.clone());
    match nodes.get_opt(node).await {
        Ok(Some(n)) => node_ready_condition(&n),
        Ok(None) => Err(format!("node {node} does not exist")),
        Err(e) => Err(format!("reading node {node}: {e}")),
    }
}

/// Reads the node's Ready condition. Pure.
pub fn node_ready_condition(node: &Node) -> Result<(), String> {
    let name = node.metadata.name.clone().unwrap_or_default();
    match bosun_cluster::readers::ready_condition(node) {
        Some(c) if c.status == "True" => Ok(()),
        Some(c) => {
            let reason = c.reason.clone().unwrap_or_default();
            let message = c.message.clone().unwrap_or_default();
            Err(format!(
                "node {name} is not Ready (Ready={}{}{})",
                c.status,
                if reason.is_empty() {
                    String::new()
                } else {
                    format!(", {reason}")
                },
                if message.is_empty() {
                    String::new()
                } else {
                    format!(": {message}")
                }
            ))
        }
        None => Err(format!(
            "node {name} reports no Ready condition (is its kubelet running?)"
        )),
    }
}

/// Whether the API server answers `GET /readyz` with `ok`; `Err` carries what it said.
pub async fn api_server_ready(client: &Client) -> Result<(), String> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| format!("building the /readyz request: {e}"))?;
    match client.request_text(request).await {
        Ok(text) if text.trim() == "ok" => Ok(()),
        Ok(text) => Err(format!(
            "the API server's /readyz answered {:?}",
            text.trim()
        )),
        Err(e) => Err(format!("the API server's /readyz failed: {e}")),
    }
}

/// The action of the step that restarts a control plane's static Pods (the `certs` plugin's).
pub const RESTART_CONTROL_PLANE: &str = "restart-control-plane";

/// When the task's `restart-control-plane` step began and which components it restarted
/// (its `restarted` output; every control-plane Pod when it has none), if it ran.
pub fn restarted_since(task: &NodeTask) -> Option<(Timestamp, Option<Vec<String>>)> {
    let step = task
        .spec
        .steps
        .iter()
        .rev()
        .find(|s| s.action == RESTART_CONTROL_PLANE)?;
    let status = task
        .status
        .as_ref()?
        .steps
        .iter()
        .find(|s| s.name == step.name)?;
    let since = status.started_at.as_ref()?.0;
    let components = status
        .outputs
        .get("restarted")
        .map(|r| r.split(',').map(str::to_owned).collect());
    Some((since, components))
}

/// Whether a control-plane node's static Pods are up: each Ready, and each component a
/// restart step restarted (`restarted`) running a container started at or after it began.
/// `pods` are the node's mirror Pods labelled `tier=control-plane`; none (a worker, or a
/// control plane not made by kubeadm) passes. Pure.
pub fn control_plane_pods_up(
    node: &str,
    pods: &[Pod],
    restarted: Option<&(Timestamp, Option<Vec<String>>)>,
) -> Result<(), String> {
    let mut waiting = Vec::new();
    for pod in pods {
        let name = pod.name_any();
        let component = pod.labels().get("component").cloned().unwrap_or_default();
        let status = pod.status.as_ref();
        let ready = status
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default()
            .iter()
            .find(|c| c.type_ == "Ready");
        if ready.is_none_or(|c| c.status != "True") {
            waiting.push(format!(
                "static Pod {name} is not Ready{}",
                ready
                    .and_then(|c| c.reason.clone())
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            ));
            continue;
        }
        let Some((since, components)) = restarted else {
            continue;
        };
        if components
            .as_ref()
            .is_some_and(|cs| !cs.contains(&component))
        {
            continue;
        }
        let started = status
            .and_then(|s| s.container_statuses.as_deref())
            .unwrap_or_default()
            .iter()
            .filter_map(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref())
            .map(|t| t.0)
            .min();
        match started {
            Some(at) if at >= *since => {}
            Some(at) => waiting.push(format!(
                "static Pod {name} still runs the container started at {at}, before the {RESTART_CONTROL_PLANE} step began at {since} (the kubelet has not restarted it yet)"
            )),
            None => waiting.push(format!("static Pod {name} has no running container")),
        }
    }
    if waiting.is_empty() {
        Ok(())
    } else {
        Err(format!("on node {node}: {}", waiting.join("; ")))
    }
}

/// Reads the node's control-plane static Pods and judges them ([`control_plane_pods_up`]).
pub async fn control_plane_pods(client: &Client, task: &NodeTask) -> Result<(), String> {
    let node = &task.spec.node_name;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let params = ListParams::default()
        .labels("tier=control-plane")
        .fields(&format!("spec.nodeName={node}"));
    match pods.list(&params).await {
        Ok(list) => control_plane_pods_up(node, &list.items, restarted_since(task).as_ref()),
        Err(e) => Err(format!(
            "listing the control-plane Pods of node {node} in kube-system: {e}"
        )),
    }
}

/// Runs the enabled checks once. `Err` joins every failing gate's reason.
pub async fn check(client: &Client, gates: &HealthGates, task: &NodeTask) -> Result<(), String> {
    let node = task.spec.node_name.as_str();
    let mut failing = Vec::new();
    if gates.node_ready
        && let Err(e) = node_ready(client, node).await
    {
        failing.push(e);
    }
    if gates.api_server
        && let Err(e) = api_server_ready(client).await
    {
        failing.push(e);
    }
    if gates.control_plane_pods
        && let Err(e) = control_plane_pods(client, task).await
    {
        failing.push(e);
    }
    if failing.is_empty() {
        Ok(())
    } else {
        Err(failing.join("; "))
    }
}

/// One pass of the gates for a task whose steps all finished: checks, and returns the
/// verdict with the `HealthGates` condition to record, `None` when the task already holds
/// it (so an unchanged wait writes nothing and does not wake the controller again). The
/// caller writes it: alone with [`write_condition`], or carried by the write that finishes
/// the task.
pub async fn look(
    client: &Client,
    gates: &HealthGates,
    task: &NodeTask,
) -> (Option<Condition>, Verdict) {
    let checks = check(client, gates, task).await;
    let prior = task
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == CONDITION));
    // Whole seconds, as the condition's time is stored: a clock with nanoseconds made every
    // Settling condition differ from its stored self once, and be written twice.
    let now = Timestamp::now();
    let now = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let (condition, verdict) = judge(gates, checks, prior, task.metadata.generation, now);
    ((prior != Some(&condition)).then_some(condition), verdict)
}

/// The field manager of the `HealthGates` condition when it is written alone.
pub fn manager(controller: &str) -> String {
    format!("{controller}.gates")
}

/// Writes the `HealthGates` condition alone, under [`manager`].
pub async fn write_condition(
    client: &Client,
    controller: &str,
    task: &NodeTask,
    condition: &Condition,
) -> Result<()> {
    let name = task.name_any();
    let api: Api<NodeTask> = Api::all(client.clone());
    let patch = json!({
        "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeTask", "metadata": { "name": name },
        "status": { "conditions": [condition] },
    });
    api.patch_status(
        &name,
        &PatchParams::apply(&manager(controller)).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(Error::kube(format!(
        "writing the HealthGates condition of NodeTask {name}"
    )))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};

    fn t(s: u64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + i64::try_from(s).unwrap()).unwrap()
    }

    fn gates(settle: u32, timeout: u32) -> HealthGates {
        HealthGates {
            settle_seconds: settle,
            timeout_seconds: timeout,
            ..HealthGates::default()
        }
    }

    fn static_pod(component: &str, ready: bool, started: Option<u64>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": format!("{component}-cp-2"), "namespace": "kube-system",
                "labels": { "component": component, "tier": "control-plane" } },
            "status": {
                "conditions": [{ "type": "Ready", "status": if ready { "True" } else { "False" },
                    "reason": if ready { "" } else { "ContainersNotReady" } }],
                "containerStatuses": [{ "name": component, "image": "x", "imageID": "", "ready": ready,
                    "restartCount": 0,
                    "state": match started {
                        Some(s) => serde_json::json!({ "running": { "startedAt": t(s).to_string() } }),
                        None => serde_json::json!({ "waiting": { "reason": "ContainerCreating" } }),
                    } }]
            }
        }))
        .unwrap()
    }

    #[test]
    fn control_plane_pods_must_be_ready_and_restarted_after_the_restart_step() {
        let restart = (
            t(100),
            Some(vec!["etcd".to_owned(), "kube-apiserver".to_owned()]),
        );
        // A worker (no static Pods) passes.
        assert_eq!(control_plane_pods_up("w-1", &[], Some(&restart)), Ok(()));
        // Ready and started after the restart step began: up.
        let up = [
            static_pod("etcd", true, Some(130)),
            static_pod("kube-apiserver", true, Some(135)),
            // Not restarted by the step: only Ready counts.
            static_pod("kube-scheduler", true, Some(5)),
        ];
        assert_eq!(control_plane_pods_up("cp-2", &up, Some(&restart)), Ok(()));
        // The kubelet has not restarted etcd yet: its old container still reads Ready.
        let stale = [
            static_pod("etcd", true, Some(50)),
            static_pod("kube-apiserver", true, Some(135)),
        ];
        let why = control_plane_pods_up("cp-2", &stale, Some(&restart)).unwrap_err();
        assert!(
            why.starts_with(
                "on node cp-2: static Pod etcd-cp-2 still runs the container started at"
            ) && why.contains("before the restart-control-plane step began at"),
            "{why}"
        );
        // Restarted but not Ready yet.
        let starting = [
            static_pod("etcd", true, Some(130)),
            static_pod("kube-apiserver", false, None),
        ];
        assert_eq!(
            control_plane_pods_up("cp-2", &starting, Some(&restart)),
            Err(
                "on node cp-2: static Pod kube-apiserver-cp-2 is not Ready (ContainersNotReady)"
                    .to_owned()
            )
        );
        // Without a restart step, a Ready Pod passes however old its container.
        assert_eq!(control_plane_pods_up("cp-2", &stale, None), Ok(()));
        // A restart step without its output: every control-plane Pod must be fresh.
        let all = (t(100), None);
        let why = control_plane_pods_up("cp-2", &up, Some(&all)).unwrap_err();
        assert!(why.contains("kube-scheduler-cp-2 still runs"), "{why}");
    }

    #[test]
    fn the_restart_step_is_found_with_its_start_and_output() {
        let task: NodeTask = serde_json::from_value(serde_json::json!({
            "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeTask",
            "metadata": { "name": "renew-cp-2" },
            "spec": { "operation": "renew", "nodeName": "cp-2", "group": "control-plane", "steps": [
                { "name": "renew-certificates", "plugin": "certs", "action": "renew" },
                { "name": "restart-control-plane", "plugin": "certs", "action": "restart-control-plane" },
                { "name": "wait-api-server", "plugin": "", "action": "waitApiServer", "runsOn": "controller" }
            ] },
            "status": { "steps": [
                { "name": "renew-certificates", "phase": "Succeeded", "attempts": 1, "startedAt": t(90).to_string() },
                { "name": "restart-control-plane", "phase": "Succeeded", "attempts": 1, "startedAt": t(100).to_string(),
                  "outputs": { "restarted": "etcd,kube-apiserver" } }
            ] }
        }))
        .unwrap();
        assert_eq!(
            restarted_since(&task),
            Some((
                t(100),
                Some(vec!["etcd".to_owned(), "kube-apiserver".to_owned()])
            ))
        );
        let mut not_started = task.clone();
        not_started.status.as_mut().unwrap().steps.pop();
        assert_eq!(restarted_since(&not_started), None);
    }

    #[test]
    fn passing_gates_without_settle_time_pass_at_once() {
        let (c, v) = judge(&gates(0, 600), Ok(()), None, Some(1), t(0));
        assert_eq!(v, Verdict::Pass);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reasons::PASSED)
        );
    }

    #[test]
    fn settle_time_counts_from_when_the_gates_first_passed() {
        let g = gates(30, 600);
        let (c, v) = judge(&g, Ok(()), None, None, t(100));
        assert_eq!(v, Verdict::Wait(Duration::from_secs(30)));
        assert_eq!(c.reason, reasons::SETTLING);
        let (c2, v2) = judge(&g, Ok(()), Some(&c), None, t(120));
        assert_eq!(v2, Verdict::Wait(Duration::from_secs(10)));
        assert_eq!(c2.last_transition_time.0, t(100));
        let (c3, v3) = judge(&g, Ok(()), Some(&c2), None, t(130));
        assert_eq!(v3, Verdict::Pass);
        assert_eq!(c3.last_transition_time.0, t(100));
    }

    #[test]
    fn a_gate_failing_while_settling_starts_the_wait_over() {
        let g = gates(30, 600);
        let (settling, _) = judge(&g, Ok(()), None, None, t(100));
        let (waiting, v) = judge(
            &g,
            Err("node n1 is not Ready".into()),
            Some(&settling),
            None,
            t(110),
        );
        assert_eq!(v, Verdict::Wait(RECHECK));
        assert_eq!(
            (waiting.reason.as_str(), waiting.last_transition_time.0),
            (reasons::WAITING, t(110))
        );
        let (again, v) = judge(&g, Ok(()), Some(&waiting), None, t(120));
        assert_eq!(
            again.last_transition_time.0,
            t(120),
            "settling restarts from the new pass"
        );
        assert_eq!(v, Verdict::Wait(Duration::from_secs(30)));
    }

    #[test]
    fn a_gate_that_keeps_failing_fails_after_the_timeout_with_its_reason() {
        let g = gates(0, 60);
        let why =
            || Err::<(), _>("node n1 is not Ready (Ready=False, KubeletNotReady)".to_string());
        let (w1, v1) = judge(&g, why(), None, None, t(0));
        assert_eq!(v1, Verdict::Wait(RECHECK));
        let (w2, v2) = judge(&g, why(), Some(&w1), None, t(59));
        assert_eq!(v2, Verdict::Wait(Duration::from_secs(1)));
        assert_eq!(w2, w1, "an unchanged wait writes an identical condition");
        let (f, v3) = judge(&g, why(), Some(&w2), None, t(60));
        let Verdict::Fail(message) = v3 else {
            panic!("expected a failure")
        };
        assert!(
            message.contains("within 60s") && message.contains("node n1 is not Ready"),
            "{message}"
        );
        assert_eq!(
            (f.status.as_str(), f.reason.as_str()),
            ("False", reasons::FAILED)
        );
        // After recovery: Retry the task runs again and a new wait begins.
        let (w3, v4) = judge(&g, why(), Some(&f), None, t(500));
        assert_eq!(
            (w3.reason.as_str(), w3.last_transition_time.0),
            (reasons::WAITING, t(500))
        );
        assert_eq!(v4, Verdict::Wait(RECHECK));
    }

    fn node(status: Option<&str>) -> Node {
        Node {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("n1".into()),
                ..Default::default()
            },
            spec: None,
            status: Some(NodeStatus {
                conditions: status.map(|s| {
                    vec![NodeCondition {
                        type_: "Ready".into(),
                        status: s.into(),
                        reason: Some("KubeletNotReady".into()),
                        message: Some("PLEG is not healthy".into()),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn node_readiness_comes_from_its_ready_condition() {
        assert_eq!(node_ready_condition(&node(Some("True"))), Ok(()));
        assert_eq!(
            node_ready_condition(&node(Some("False"))),
            Err("node n1 is not Ready (Ready=False, KubeletNotReady: PLEG is not healthy)".into())
        );
        assert!(
            node_ready_condition(&node(None))
                .unwrap_err()
                .contains("no Ready condition")
        );
    }
}
