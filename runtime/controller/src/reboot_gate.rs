//! The reboot gates (docs/reboots.md): before a reboot Operation starts a node's task (its
//! cordon), the controller asks whether the node may go down now:
//!
//! - **blocking pods**: a pod matching `spec.reboot.blockingPodSelector` runs on the node
//!   (kured's `--blocking-pod-selector`);
//! - **alerts**: Prometheus reports alerts at `spec.reboot.alerts.prometheusUrl`, other than
//!   those `ignoreAlerts` names (kured's `--prometheus-url`, `--alert-filter-regexp`).
//!
//! A gate that says no **holds** the task: it stays Pending, with the gate's message and a
//! [`CONDITION`] condition on the NodeTask, a line in the Operation's message and a
//! `RebootGate` condition there, and an Event when what holds it changes. The gates are
//! asked again every [`RECHECK`] until they let the node go. Nothing is blocked: a hold ends
//! by itself, as kured's does. A gate that cannot be asked (Prometheus down, a bad regular
//! expression) holds too, and says why: a gate that fails open would reboot during the very
//! outage it exists to wait out.
//!
//! Gates are asked only before a task starts. A pod scheduled onto the node after its
//! cordon does not stop the drain, as with kured.
//!
//! The decisions are pure functions ([`blocking_pods`], [`alerts`]) over what was read, so
//! every rule is a unit test; [`check`] reads and decides.

use std::time::Duration;

use bosun_api::operation::{AlertGate, RebootSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde::Deserialize;

/// The NodeTask's condition while a gate holds it, and the Operation's while one holds any.
pub const CONDITION: &str = "RebootGate";
/// A blocking pod holds the node.
pub const REASON_BLOCKING_POD: &str = "BlockingPod";
/// Alerts fire.
pub const REASON_ALERTS: &str = "AlertsFiring";
/// A gate could not be asked; it holds (fails closed).
pub const REASON_UNAVAILABLE: &str = "GateUnavailable";
/// The Operation's condition while a gate holds a node.
pub const REASON_HELD: &str = "NodeHeldByGate";
/// The Operation's condition when no gate holds a node.
pub const REASON_CLEAR: &str = "GatesClear";
/// How often a held node's gates are asked again.
pub const RECHECK: Duration = Duration::from_secs(30);
/// The most bytes read of Prometheus's answer.
const MAX_ALERTS_BYTES: u64 = 8 << 20;
/// How many pods or alerts a message names.
const NAMED: usize = 3;

/// What holds a node's reboot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub reason: &'static str,
    pub message: String,
}

/// How the controller reaches Prometheus: https verified against the system's roots, plain
/// http only to the `HOST:PORT`s of `--prometheus-plain-http`.
#[derive(Clone, Debug)]
pub struct Gates {
    /// The client, or why there is none.
    fetcher: Result<bosun_fetch::Fetcher, String>,
}

impl Default for Gates {
    fn default() -> Self {
        Gates::new(&[]).unwrap_or_else(|e| Gates {
            fetcher: Err(e.to_string()),
        })
    }
}

impl Gates {
    /// A client allowing plain http to `plain_http` (`HOST:PORT` each). Fails on a
    /// malformed `HOST:PORT`, or without trust roots.
    pub fn new(plain_http: &[String]) -> Result<Gates, bosun_fetch::ConfigError> {
        let config = bosun_fetch::FetchConfig {
            max_body_bytes: MAX_ALERTS_BYTES,
            timeout: Duration::from_secs(10),
            insecure_registries: plain_http.to_vec(),
            ..Default::default()
        };
        Ok(Gates {
            fetcher: Ok(bosun_fetch::Fetcher::new(&config)?),
        })
    }
}

/// Asks `spec`'s gates about `node`. `None`: the node may start.
pub async fn check(client: &Client, gates: &Gates, spec: &RebootSpec, node: &str) -> Option<Held> {
    if let Some(selector) = &spec.blocking_pod_selector {
        let pods: Api<Pod> = Api::all(client.clone());
        let listed = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await;
        let held = match listed {
            Ok(list) => blocking_pods(node, &list.items, selector),
            Err(e) => Some(Held {
                reason: REASON_UNAVAILABLE,
                message: format!(
                    "could not list the pods on node {node} for spec.reboot.blockingPodSelector ({e}): its reboot waits until they can be read (asked again every {}s)",
                    RECHECK.as_secs()
                ),
            }),
        };
        if held.is_some() {
            return held;
        }
    }
    let gate = spec.alerts.as_ref()?;
    let body = fetch_alerts(gates, gate).await;
    alerts(node, gate, body)
}

/// The body of `GET <prometheusUrl>/api/v1/alerts`, or why there is none.
async fn fetch_alerts(gates: &Gates, gate: &AlertGate) -> Result<Vec<u8>, String> {
    let fetcher = gates
        .fetcher
        .as_ref()
        .map_err(|why| format!("the controller has no HTTP client: {why}"))?;
    let url = alerts_url(&gate.prometheus_url)?;
    match fetcher.get(&url, &[], MAX_ALERTS_BYTES, true).await {
        Ok(r) if r.status.is_success() => Ok(r.body.to_vec()),
        Ok(r) => Err(format!("GET {url} answered {}", r.status)),
        Err(bosun_fetch::FetchError::PlainHttp { url, .. }) => Err(format!(
            "refusing plain http to {url}: the controller reaches Prometheus over plain http only at a HOST:PORT its --prometheus-plain-http lists (Helm value controller.prometheusPlainHttp); list it there, or use https"
        )),
        Err(e) => Err(e.to_string()),
    }
}

/// `<base>/api/v1/alerts`, keeping a path prefix (`http://h:9090/prometheus`).
fn alerts_url(base: &str) -> Result<url::Url, String> {
    let trimmed = base.trim_end_matches('/');
    url::Url::parse(&format!("{trimmed}/api/v1/alerts")).map_err(|e| {
        format!("spec.reboot.alerts.prometheusUrl {base:?} is not a URL ({e}): fix it")
    })
}

/// The blocking-pod gate: the pods on `node` matching `selector` that have not finished.
pub fn blocking_pods(
    node: &str,
    pods: &[Pod],
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> Option<Held> {
    let mut blocking = Vec::new();
    for pod in pods {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        match bosun_planner::selector::matches(selector, pod.labels()) {
            Ok(true) => blocking.push(format!(
                "{}/{}",
                pod.namespace().unwrap_or_default(),
                pod.name_any()
            )),
            Ok(false) => {}
            Err(e) => {
                return Some(Held {
                    reason: REASON_UNAVAILABLE,
                    message: format!(
                        "spec.reboot.blockingPodSelector cannot be evaluated ({e}): the reboot of node {node} waits until the Operation is replaced with a valid selector"
                    ),
                });
            }
        }
    }
    if blocking.is_empty() {
        return None;
    }
    blocking.sort();
    Some(Held {
        reason: REASON_BLOCKING_POD,
        message: format!(
            "{} on node {node} {} spec.reboot.blockingPodSelector: the node's reboot waits until no such pod runs there (asked again every {}s)",
            named(&blocking, "pod"),
            if blocking.len() == 1 {
                "matches"
            } else {
                "match"
            },
            RECHECK.as_secs()
        ),
    })
}

/// `pod a/b`, `pods a/b, a/c`, `pods a/b, a/c, a/d and 2 more`.
fn named(items: &[String], noun: &str) -> String {
    let shown = items[..items.len().min(NAMED)].join(", ");
    let plural = if items.len() == 1 { "" } else { "s" };
    match items.len().saturating_sub(NAMED) {
        0 => format!("{noun}{plural} {shown}"),
        more => format!("{noun}{plural} {shown} and {more} more"),
    }
}

/// Prometheus's `/api/v1/alerts` answer, the parts read.
#[derive(Deserialize)]
struct AlertsAnswer {
    status: String,
    #[serde(default)]
    data: Option<AlertsData>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct AlertsData {
    alerts: Vec<Alert>,
}

#[derive(Deserialize)]
struct Alert {
    #[serde(default)]
    labels: std::collections::BTreeMap<String, String>,
    state: String,
}

/// The alert gate over Prometheus's answer (`body`, or why there is none).
pub fn alerts(node: &str, gate: &AlertGate, body: Result<Vec<u8>, String>) -> Option<Held> {
    let url = &gate.prometheus_url;
    let unavailable = |why: String| Held {
        reason: REASON_UNAVAILABLE,
        message: format!(
            "could not ask Prometheus at {url} for its alerts ({why}): the reboot of node {node} waits until it answers (asked again every {}s)",
            RECHECK.as_secs()
        ),
    };
    let ignore = match gate.ignore_alerts.as_deref().map(anchored) {
        None => None,
        Some(Ok(re)) => Some(re),
        Some(Err(e)) => {
            return Some(Held {
                reason: REASON_UNAVAILABLE,
                message: format!(
                    "spec.reboot.alerts.ignoreAlerts is not a regular expression ({e}): the reboot of node {node} waits until the Operation is replaced with a valid one"
                ),
            });
        }
    };
    let body = match body {
        Ok(b) => b,
        Err(why) => return Some(unavailable(why)),
    };
    let answer: AlertsAnswer = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            return Some(unavailable(format!(
                "the answer is not Prometheus's alerts JSON: {e}"
            )));
        }
    };
    let Some(data) = answer.data.filter(|_| answer.status == "success") else {
        return Some(unavailable(format!(
            "it answered status {:?}{}",
            answer.status,
            answer.error.map(|e| format!(": {e}")).unwrap_or_default()
        )));
    };
    let mut counted: Vec<String> = Vec::new();
    let mut ignored = 0usize;
    for alert in &data.alerts {
        if gate.firing_only && alert.state != "firing" {
            continue;
        }
        let name = alert
            .labels
            .get("alertname")
            .cloned()
            .unwrap_or_else(|| "(no alertname)".into());
        if ignore.as_ref().is_some_and(|re| re.is_match(&name)) {
            ignored += 1;
            continue;
        }
        let shown = if alert.state == "firing" {
            name
        } else {
            format!("{name} ({})", alert.state)
        };
        if !counted.contains(&shown) {
            counted.push(shown);
        }
    }
    if counted.is_empty() {
        return None;
    }
    counted.sort();
    Some(Held {
        reason: REASON_ALERTS,
        message: format!(
            "Prometheus at {url} reports {}{}: the reboot of node {node} waits until none is left (asked again every {}s)",
            named(&counted, "alert"),
            match ignored {
                0 => String::new(),
                n => format!(" ({n} more ignored by ignoreAlerts)"),
            },
            RECHECK.as_secs()
        ),
    })
}

/// `pattern` matching whole names only.
fn anchored(pattern: &str) -> Result<regex::Regex, regex::Error> {
    regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
        .size_limit(1 << 20)
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(ns: &str, name: &str, app: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name, "labels": {"app": app}},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    #[test]
    fn blocking_pods_hold_until_none_that_matches_runs() {
        let selector = serde_json::from_value(json!({"matchLabels": {"app": "batch"}})).unwrap();
        // (pods on the node, expected: None or the message's start)
        let cases: Vec<(Vec<Pod>, Option<&str>)> = vec![
            (vec![], None),
            (vec![pod("a", "web", "web", "Running")], None),
            // Finished pods do not hold.
            (
                vec![
                    pod("a", "j1", "batch", "Succeeded"),
                    pod("a", "j2", "batch", "Failed"),
                ],
                None,
            ),
            (
                vec![pod("a", "j1", "batch", "Running")],
                Some("pod a/j1 on node w-1 matches spec.reboot.blockingPodSelector"),
            ),
            // Pending counts: it is about to run there.
            (
                vec![
                    pod("b", "j2", "batch", "Pending"),
                    pod("a", "j1", "batch", "Running"),
                ],
                Some("pods a/j1, b/j2 on node w-1 match"),
            ),
            (
                (0..5)
                    .map(|i| pod("a", &format!("j{i}"), "batch", "Running"))
                    .collect(),
                Some("pods a/j0, a/j1, a/j2 and 2 more on node w-1 match"),
            ),
        ];
        for (pods, expected) in cases {
            let held = blocking_pods("w-1", &pods, &selector);
            match expected {
                None => assert_eq!(held, None),
                Some(start) => {
                    let held = held.expect(start);
                    assert_eq!(held.reason, REASON_BLOCKING_POD);
                    assert!(held.message.starts_with(start), "{}", held.message);
                    assert!(held.message.contains("waits until no such pod"));
                }
            }
        }
        // A selector the API server's schema would refuse: held, and said why.
        let bad = serde_json::from_value(
            json!({"matchExpressions": [{"key": "app", "operator": "Near"}]}),
        )
        .unwrap();
        let held = blocking_pods("w-1", &[pod("a", "x", "y", "Running")], &bad).unwrap();
        assert_eq!(held.reason, REASON_UNAVAILABLE);
    }

    fn answer(alerts: &[(&str, &str)]) -> Result<Vec<u8>, String> {
        let alerts: Vec<_> = alerts
            .iter()
            .map(|(name, state)| json!({"labels": {"alertname": name, "severity": "warning"}, "annotations": {}, "state": state, "activeAt": "2026-12-05T20:00:00Z", "value": "1e+00"}))
            .collect();
        Ok(serde_json::to_vec(&json!({"status": "success", "data": {"alerts": alerts}})).unwrap())
    }

    #[test]
    fn alerts_hold_unless_ignored_and_a_prometheus_that_cannot_answer_holds_too() {
        let gate = |ignore: Option<&str>, firing_only: bool| AlertGate {
            prometheus_url: "http://prom:9090".into(),
            ignore_alerts: ignore.map(Into::into),
            firing_only,
        };
        // (gate, answer, expected reason, the message's parts)
        type Case = (
            AlertGate,
            Result<Vec<u8>, String>,
            Option<&'static str>,
            Vec<&'static str>,
        );
        let cases: Vec<Case> = vec![
            (gate(None, false), answer(&[]), None, vec![]),
            (
                gate(None, false),
                answer(&[("NodeDown", "firing"), ("DiskSlow", "pending")]),
                Some(REASON_ALERTS),
                vec![
                    "reports alerts DiskSlow (pending), NodeDown:",
                    "node w-1 waits",
                ],
            ),
            // firingOnly leaves the pending one out.
            (
                gate(None, true),
                answer(&[("DiskSlow", "pending")]),
                None,
                vec![],
            ),
            // Ignored by a whole-name match; `Watch` does not ignore `Watchdog`.
            (
                gate(Some("Watchdog|Info.*"), false),
                answer(&[("Watchdog", "firing"), ("InfoInhibitor", "firing")]),
                None,
                vec![],
            ),
            (
                gate(Some("Watch"), false),
                answer(&[("Watchdog", "firing")]),
                Some(REASON_ALERTS),
                vec!["reports alert Watchdog:"],
            ),
            (
                gate(Some("Watchdog"), false),
                answer(&[("Watchdog", "firing"), ("NodeDown", "firing")]),
                Some(REASON_ALERTS),
                vec!["alert NodeDown (1 more ignored by ignoreAlerts)"],
            ),
            // Fails closed.
            (
                gate(None, false),
                Err("connection refused".into()),
                Some(REASON_UNAVAILABLE),
                vec![
                    "could not ask Prometheus at http://prom:9090",
                    "connection refused",
                ],
            ),
            (
                gate(None, false),
                Ok(b"<html>login</html>".to_vec()),
                Some(REASON_UNAVAILABLE),
                vec!["not Prometheus's alerts JSON"],
            ),
            (
                gate(None, false),
                Ok(br#"{"status":"error","error":"overloaded"}"#.to_vec()),
                Some(REASON_UNAVAILABLE),
                vec!["status \"error\": overloaded"],
            ),
            (
                gate(Some("("), false),
                answer(&[]),
                Some(REASON_UNAVAILABLE),
                vec!["ignoreAlerts is not a regular expression"],
            ),
        ];
        for (gate, body, reason, parts) in cases {
            let what = format!("{gate:?} {body:?}");
            let held = alerts("w-1", &gate, body);
            assert_eq!(held.as_ref().map(|h| h.reason), reason, "{what}");
            for part in parts {
                let message = &held.as_ref().unwrap().message;
                assert!(message.contains(part), "{message} lacks {part}");
            }
        }
    }

    #[test]
    fn the_alerts_url_keeps_a_path_prefix() {
        assert_eq!(
            alerts_url("http://h:9090/prometheus/").unwrap().as_str(),
            "http://h:9090/prometheus/api/v1/alerts"
        );
        assert_eq!(
            alerts_url("https://h").unwrap().as_str(),
            "https://h/api/v1/alerts"
        );
        assert!(alerts_url("http://[::1").is_err());
    }
}
