//! The agent's reconcile against a fake API server whose status writes fail on purpose:
//! a failed start write or a failed result write must neither leave the step Running for
//! good nor run its plugin twice.
//!
//! The fake (a `tower::service_fn` behind a real kube `Client`) keeps one NodeTask, applies
//! the status writes it accepts (each step entry replaced whole, as the agent's per-step
//! field manager owns it), answers the reads a step makes (Policies, Nodes, Operation,
//! version, the Plugin list and the Plugin) and records every request. The step's Plugin
//! does not exist, so a run ends at plugin resolution with a PluginUnavailable failure:
//! each GET of the Plugin is one run of the step, and the result (task Blocked, reason
//! PluginUnavailable) is a real result the agent must get written.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bosun_agent::plugins::Store;
use bosun_agent::{Agent, reconcile};
use bosun_api::node_task::{BlockReason, NodeTask, NodeTaskPhase, StepPhase, StepStatus};
use bosun_fetch::{FetchConfig, Fetcher};
use bosun_host::{Host, HostConfig};
use bosun_trust::TrustRoots;
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};

const TASK: &str = "op-w1";
const NODE: &str = "w1";
const TASK_PATH: &str = "/apis/bosun.dev/v1alpha1/nodetasks/op-w1/status";
const PLUGIN_PATH: &str = "/apis/bosun.dev/v1alpha1/plugins/hello";

/// One request the fake saw, and whether it answered it with a 500.
#[derive(Clone, Debug)]
struct Seen {
    method: String,
    path: String,
    /// The query string.
    query: String,
    body: Value,
    failed: bool,
}

impl Seen {
    fn step_write(&self) -> bool {
        self.method == "PATCH"
            && self.path == TASK_PATH
            && self.body.pointer("/status/steps/0").is_some()
    }
    /// A write of the step as Running (the start write).
    fn is_start(&self) -> bool {
        self.step_write() && self.body.pointer("/status/steps/0/phase") == Some(&json!("Running"))
    }
    /// A write of the step's result (it has a finish time).
    fn is_result(&self) -> bool {
        self.step_write() && self.body.pointer("/status/steps/0/finishedAt").is_some()
    }
    /// A GET of the step's Plugin: the first thing a run of the step does after its start
    /// write.
    fn is_run(&self) -> bool {
        self.method == "GET" && self.path == PLUGIN_PATH
    }
}

/// The fake API server's state.
struct Fake {
    /// The NodeTask as the server holds it.
    task: Mutex<Value>,
    seen: Mutex<Vec<Seen>>,
    /// How many more requests matching `fail` get a 500.
    failures_left: Mutex<u32>,
    fail: fn(&Seen) -> bool,
    /// The Node's `spec.unschedulable` (false: schedulable, as an uncordoned node).
    unschedulable: Mutex<bool>,
}

impl Fake {
    /// The server's NodeTask, as an up-to-date watch cache would show it.
    fn task(&self) -> NodeTask {
        serde_json::from_value(self.task.lock().unwrap().clone()).unwrap()
    }
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
    fn count(&self, what: fn(&Seen) -> bool) -> usize {
        self.seen().iter().filter(|s| what(s)).count()
    }

    /// Applies an accepted status write: top-level fields replaced, step entries replaced
    /// whole by name.
    fn apply(&self, patch: &Value) {
        let mut task = self.task.lock().unwrap();
        let status = task["status"].as_object_mut().unwrap();
        for (key, value) in patch["status"].as_object().unwrap() {
            if key != "steps" {
                status.insert(key.clone(), value.clone());
                continue;
            }
            let steps = status
                .entry("steps")
                .or_insert_with(|| json!([]))
                .as_array_mut()
                .unwrap();
            for entry in value.as_array().unwrap() {
                steps.retain(|s| s["name"] != entry["name"]);
                steps.push(entry.clone());
            }
        }
    }

    fn answer(&self, request: &Seen) -> (u16, Value) {
        let not_found = (
            404,
            json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found" }),
        );
        match (request.method.as_str(), request.path.as_str()) {
            ("PATCH", TASK_PATH) => {
                self.apply(&request.body);
                (200, self.task.lock().unwrap().clone())
            }
            // No Plugin declares a backend: the step's own plugin, hello, is read next.
            ("GET", "/apis/bosun.dev/v1alpha1/plugins") => (
                200,
                json!({ "apiVersion": "bosun.dev/v1alpha1", "kind": "PluginList", "metadata": { "resourceVersion": "1" }, "items": [] }),
            ),
            ("GET", "/apis/bosun.dev/v1alpha1/policies") => (
                200,
                json!({ "apiVersion": "bosun.dev/v1alpha1", "kind": "PolicyList", "metadata": { "resourceVersion": "1" }, "items": [] }),
            ),
            ("GET", "/apis/bosun.dev/v1alpha1/nodetasks") => (
                200,
                json!({ "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeTaskList", "metadata": { "resourceVersion": "1" }, "items": [self.task.lock().unwrap().clone()] }),
            ),
            ("GET", "/api/v1/nodes") => (
                200,
                json!({ "apiVersion": "v1", "kind": "NodeList", "metadata": { "resourceVersion": "1" }, "items": [self.node()] }),
            ),
            ("GET", "/api/v1/nodes/w1") => (200, self.node()),
            ("GET", "/version") => (
                200,
                json!({ "major": "1", "minor": "34", "gitVersion": "v1.34.4", "gitCommit": "", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc", "platform": "linux/amd64" }),
            ),
            ("POST", path) if path.ends_with("/events") => (201, request.body.clone()),
            ("PATCH", path) if path.starts_with("/apis/bosun.dev/v1alpha1/nodereports/") => {
                (200, request.body.clone())
            }
            _ => not_found,
        }
    }
}

impl Fake {
    fn node(&self) -> Value {
        json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": NODE },
            "spec": { "unschedulable": *self.unschedulable.lock().unwrap() },
            "status": { "conditions": [{ "type": "Ready", "status": "True" }] } })
    }
}

/// A Running task with one agent step, `hello`, not started yet.
fn running_task() -> Value {
    json!({
        "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeTask",
        "metadata": { "name": TASK, "uid": "0f1e2d3c-uid", "resourceVersion": "1" },
        "spec": { "operation": "op", "nodeName": NODE, "group": "workers",
            "steps": [{ "name": "hello", "plugin": "hello", "action": "greet", "runsOn": "agent" }] },
        "status": { "phase": "Running", "attempts": 1, "steps": [] },
    })
}

/// A fake API server holding `task` whose first `failures` requests matching `fail` get a
/// 500 (and change nothing), and an agent for node `w1` talking to it.
fn setup(
    task: Value,
    failures: u32,
    fail: fn(&Seen) -> bool,
) -> (Arc<Fake>, Arc<Agent>, tempfile::TempDir) {
    let fake = Arc::new(Fake {
        task: Mutex::new(task),
        seen: Mutex::new(Vec::new()),
        failures_left: Mutex::new(failures),
        fail,
        unschedulable: Mutex::new(false),
    });
    let server = fake.clone();
    let service = tower::service_fn(move |req: http::Request<Body>| {
        let server = server.clone();
        async move {
            // A watch is left open and silent (the Policy reflector only needs its list).
            if req
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|p| p == "watch=true"))
            {
                std::future::pending::<()>().await;
            }
            let method = req.method().to_string();
            let path = req.uri().path().to_owned();
            let query = req.uri().query().unwrap_or_default().to_owned();
            let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let mut request = Seen {
                method,
                path,
                query,
                body,
                failed: false,
            };
            if (server.fail)(&request) {
                let mut left = server.failures_left.lock().unwrap();
                request.failed = *left > 0;
                *left = left.saturating_sub(1);
            }
            let (code, reply) = if request.failed {
                (
                    500,
                    json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "etcd is unavailable", "reason": "InternalError", "code": 500 }),
                )
            } else {
                server.answer(&request)
            };
            server.seen.lock().unwrap().push(request);
            let response = http::Response::builder()
                .status(code)
                .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                .unwrap();
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    let client = Client::new(service, "default");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let host = Host::new(HostConfig::new(&root, TrustRoots::new())).unwrap();
    let store = Store::new(dir.path().join("plugins")).unwrap();
    let fetcher = Fetcher::new(&FetchConfig::default()).unwrap();
    let agent = Agent::new(
        client.clone(),
        NODE.into(),
        Arc::new(host),
        store,
        fetcher,
        format!("bosun-agent-{NODE}"),
    );
    tokio::spawn(agent.policies.drive(client, None).unwrap());
    (fake, Arc::new(agent), dir)
}

/// Reconciles the server's task (as an up-to-date cache would show it) until its step has
/// a result, at most `max` times, 100 ms apart (the agent asks to be called again after a
/// backoff; the controller would wait that long). Returns the reconcile results' errors.
async fn reconcile_until_finished(fake: &Fake, agent: &Arc<Agent>, max: usize) -> Vec<String> {
    reconcile_until(fake, agent, max, |_| true).await
}

/// Reconciles the fake's task at most `max` times, until a step `done` picks has a result;
/// returns the reconcile errors.
async fn reconcile_until(
    fake: &Fake,
    agent: &Arc<Agent>,
    max: usize,
    done: impl Fn(&StepStatus) -> bool,
) -> Vec<String> {
    let mut errors = Vec::new();
    for _ in 0..max {
        let task = fake.task();
        let finished = task
            .status
            .as_ref()
            .is_some_and(|s| s.steps.iter().any(|s| done(s) && s.finished_at.is_some()));
        if finished {
            break;
        }
        if let Err(e) = reconcile(Arc::new(task), agent.clone()).await {
            errors.push(e.to_string());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    errors
}

/// The step ran once and its result is on the server: step Failed at attempt 1 with its
/// finish time and message, task Blocked as PluginUnavailable.
fn assert_one_run_with_its_result(fake: &Fake) {
    let seen = fake.seen();
    assert_eq!(
        fake.count(Seen::is_run),
        1,
        "the step ran exactly once: {seen:#?}"
    );
    let task = fake.task();
    let status = task.status.unwrap();
    let step = &status.steps[0];
    assert_eq!(
        (step.phase, step.attempts),
        (StepPhase::Failed, 1),
        "{status:#?}"
    );
    assert!(
        step.finished_at.is_some() && step.started_at.is_some(),
        "{status:#?}"
    );
    assert!(
        step.message.as_deref().unwrap_or("").contains("hello"),
        "the result's message names the plugin: {status:#?}"
    );
    assert_eq!(
        (status.phase, status.reason),
        (NodeTaskPhase::Blocked, Some(BlockReason::PluginUnavailable)),
        "{status:#?}"
    );
}

#[tokio::test]
async fn a_failed_start_write_starts_the_step_again_cleanly() {
    let (fake, agent, _dir) = setup(running_task(), 1, Seen::is_start);
    let errors = reconcile_until_finished(&fake, &agent, 20).await;
    assert_eq!(
        errors.len(),
        1,
        "only the failed start write is an error: {errors:?}"
    );
    assert!(
        errors[0].contains("writing the status of NodeTask op-w1"),
        "{errors:?}"
    );

    let seen = fake.seen();
    let starts: Vec<&Seen> = seen.iter().filter(|s| s.is_start()).collect();
    assert_eq!(
        starts.len(),
        2,
        "the failed start write, then one that went through: {seen:#?}"
    );
    assert!(starts[0].failed && !starts[1].failed);
    // The second start is attempt 1 again: the failed one ran nothing and counts for nothing.
    assert_eq!(
        starts[1].body.pointer("/status/steps/0/attempts"),
        Some(&json!(1))
    );
    // No run before the start write that went through.
    let started_at = seen.iter().position(|s| s.is_start() && !s.failed).unwrap();
    assert!(
        seen.iter().position(Seen::is_run).unwrap() > started_at,
        "{seen:#?}"
    );
    assert_eq!(fake.count(Seen::is_result), 1, "{seen:#?}");
    assert_one_run_with_its_result(&fake);
}

#[tokio::test]
async fn a_failed_result_write_is_sent_again_without_running_the_step_again() {
    let (fake, agent, _dir) = setup(running_task(), 1, Seen::is_result);
    let stale = fake.task();

    // First pass: the step starts, runs, and its result write fails. That is not a
    // reconcile error: the result is kept.
    reconcile(Arc::new(fake.task()), agent.clone())
        .await
        .unwrap();
    let seen = fake.seen();
    assert_eq!(fake.count(Seen::is_run), 1, "{seen:#?}");
    let results: Vec<&Seen> = seen.iter().filter(|s| s.is_result()).collect();
    assert!(results.len() == 1 && results[0].failed, "{seen:#?}");
    assert_eq!(
        fake.task().status.unwrap().steps[0].phase,
        StepPhase::Running
    );

    // A cache that has not seen the start write yet neither runs the step again nor sends
    // the result over a status that does not show its attempt.
    reconcile(Arc::new(stale), agent.clone()).await.unwrap();
    assert_eq!(
        fake.count(Seen::is_run),
        1,
        "a stale status ran the step again: {:#?}",
        fake.seen()
    );
    assert_eq!(fake.count(Seen::is_result), 1, "{:#?}", fake.seen());

    // Later passes send the kept result once its backoff is over.
    let errors = reconcile_until_finished(&fake, &agent, 50).await;
    assert!(errors.is_empty(), "{errors:?}");
    let seen = fake.seen();
    let results: Vec<&Seen> = seen.iter().filter(|s| s.is_result()).collect();
    assert_eq!(
        results.len(),
        2,
        "the failed result write and its resend: {seen:#?}"
    );
    assert!(!results[1].failed);
    assert_eq!(
        results[0].body, results[1].body,
        "the resend is the same result"
    );
    assert_eq!(fake.count(Seen::is_start), 1, "{seen:#?}");
    assert_one_run_with_its_result(&fake);

    // Once written, later passes write nothing more.
    let writes = fake.count(Seen::step_write);
    reconcile(Arc::new(fake.task()), agent.clone())
        .await
        .unwrap();
    assert_eq!(fake.count(Seen::step_write), writes);
}

/// The restart rule still holds: a step this process never started, found Running, is
/// interrupted, not run (its plugin cannot be loaded, so it is not known to be idempotent:
/// the task blocks as Interrupted).
#[tokio::test]
async fn a_step_found_running_by_a_fresh_agent_is_interrupted_not_run() {
    let mut task = running_task();
    task["status"]["steps"] = json!([{ "name": "hello", "phase": "Running", "attempts": 1, "startedAt": "2026-01-01T00:00:00.000000Z" }]);
    let (fake, agent, _dir) = setup(task, 0, |_| false);
    reconcile(Arc::new(fake.task()), agent.clone())
        .await
        .unwrap();
    let seen = fake.seen();
    assert_eq!(fake.count(Seen::is_start), 0, "{seen:#?}");
    let status = fake.task().status.unwrap();
    assert_eq!(
        (status.steps[0].phase, status.steps[0].attempts),
        (StepPhase::Failed, 1),
        "{status:#?}"
    );
    assert_eq!(
        (status.phase, status.reason),
        (NodeTaskPhase::Blocked, Some(BlockReason::Interrupted)),
        "{status:#?}"
    );
}

/// A task whose `cordon` step succeeded, then the agent step `hello`: the task relies on
/// the node's cordon until its `uncordon`.
fn task_after_cordon() -> Value {
    json!({
        "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeTask",
        "metadata": { "name": TASK, "uid": "0f1e2d3c-uid", "resourceVersion": "1" },
        "spec": { "operation": "op", "nodeName": NODE, "group": "workers",
            "steps": [
                { "name": "cordon", "runsOn": "controller", "action": "cordon" },
                { "name": "hello", "plugin": "hello", "action": "greet", "runsOn": "agent" },
                { "name": "uncordon", "runsOn": "controller", "action": "uncordon" },
            ] },
        "status": { "phase": "Running", "attempts": 1, "steps": [
            { "name": "cordon", "phase": "Succeeded", "attempts": 1,
              "startedAt": "2026-01-01T00:00:00.000000Z", "finishedAt": "2026-01-01T00:00:00.100000Z" },
        ] },
    })
}

/// [`reconcile_until_finished`] for a task whose earlier steps finished: until its step
/// `hello` has a result.
async fn reconcile_until_hello_finished(fake: &Fake, agent: &Arc<Agent>) -> Vec<String> {
    reconcile_until(fake, agent, 20, |s| s.name == "hello").await
}

/// Someone else uncordoned the node after the task's cordon: the agent step does not start.
/// No start write (nothing is written Running) and no run (the Plugin is never read); one
/// write records the refused attempt as Failed with error `cordon-cleared` (not retryable)
/// and blocks the task as CordonCleared; a Warning Event `CordonCleared` names the node.
/// Once the node is cordoned again and the step retried, it runs as usual.
#[tokio::test]
async fn a_step_inside_the_cordon_window_does_not_start_on_an_uncordoned_node() {
    let (fake, agent, _dir) = setup(task_after_cordon(), 0, |_| false);
    let errors = reconcile_until_hello_finished(&fake, &agent).await;
    assert!(errors.is_empty(), "{errors:?}");
    let seen = fake.seen();
    assert_eq!(fake.count(Seen::is_start), 0, "no Running write: {seen:#?}");
    assert_eq!(
        fake.count(Seen::is_run),
        0,
        "the plugin never ran: {seen:#?}"
    );
    assert_eq!(fake.count(Seen::is_result), 1, "{seen:#?}");
    let status = fake.task().status.unwrap();
    assert_eq!(
        (status.phase, status.reason),
        (NodeTaskPhase::Blocked, Some(BlockReason::CordonCleared)),
        "{status:#?}"
    );
    let step = status.steps.iter().find(|s| s.name == "hello").unwrap();
    assert_eq!((step.phase, step.attempts), (StepPhase::Failed, 1));
    let error = step.error.as_ref().unwrap();
    assert_eq!(
        (error.code.as_str(), error.retryable),
        ("cordon-cleared", false)
    );
    assert!(
        error.message.starts_with(
            "node w1 is schedulable again: step `cordon` cordoned it, and someone else uncordoned it since"
        ) && error.message.contains("Bosun does not start `hello` on a schedulable node"),
        "{}",
        error.message
    );
    assert!(
        status
            .message
            .as_deref()
            .unwrap_or("")
            .starts_with("step hello failed: node w1 is schedulable again"),
        "{status:#?}"
    );
    let event = seen
        .iter()
        .find(|s| s.method == "POST" && s.path.ends_with("/events"))
        .expect("a CordonCleared Event");
    assert_eq!(
        (event.body["reason"].as_str(), event.body["type"].as_str()),
        (Some("CordonCleared"), Some("Warning"))
    );
    assert!(
        event.body["note"]
            .as_str()
            .unwrap_or("")
            .starts_with("step hello: node w1 is schedulable again"),
        "{:?}",
        event.body
    );

    // A person cordons the node again and retries: the controller's retry write puts the
    // step back to Pending (keeping its attempts) and the task Running.
    *fake.unschedulable.lock().unwrap() = true;
    {
        let mut task = fake.task.lock().unwrap();
        task["status"]["phase"] = json!("Running");
        let steps = task["status"]["steps"].as_array_mut().unwrap();
        for s in steps.iter_mut().filter(|s| s["name"] == "hello") {
            *s = json!({ "name": "hello", "phase": "Pending", "attempts": 1 });
        }
    }
    reconcile_until_hello_finished(&fake, &agent).await;
    assert_eq!(
        fake.count(Seen::is_start),
        1,
        "the retry started the step: {:#?}",
        fake.seen()
    );
    assert_eq!(fake.count(Seen::is_run), 1, "and ran it");
    let status = fake.task().status.unwrap();
    let step = status.steps.iter().find(|s| s.name == "hello").unwrap();
    // It ran (and ended at the Plugin this fake does not have).
    assert_eq!(step.attempts, 2);
    assert_eq!(status.reason, Some(BlockReason::PluginUnavailable));
}

/// The step gate never asks a cache to wait for the task's version of another resource
/// (under load that wait ran past the API server's limit: thousands of 504s at 1,000 nodes,
/// docs/benchmarks.md): the task's Operation and the control-plane Nodes come from the watch
/// cache as it is (`resourceVersion=0`), the agent's own Node from a consistent read (no
/// `resourceVersion`).
#[tokio::test]
async fn the_step_gate_reads_no_cache_at_the_tasks_version() {
    let (fake, agent, _dir) = setup(running_task(), 0, |_| false);
    reconcile_until_finished(&fake, &agent, 20).await;
    let seen = fake.seen();
    let reads = |path: &str| -> Vec<Vec<String>> {
        seen.iter()
            .filter(|s| s.method == "GET" && s.path == path)
            .map(|s| {
                s.query
                    .split('&')
                    .filter(|x| !x.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .collect()
    };
    let from_cache = |params: &Vec<String>| params.iter().any(|x| x == "resourceVersion=0");
    // This fake API server holds no Operation: the cache's "not found" is asked again with
    // a consistent read (a cache may be behind the Operation's creation).
    let operation = reads("/apis/bosun.dev/v1alpha1/operations/op");
    assert_eq!(
        operation,
        vec![vec!["resourceVersion=0".to_string()], vec![]],
        "the Operation is read from the cache as it is, then consistently when not there"
    );
    let own = reads("/api/v1/nodes/w1");
    assert!(
        !own.is_empty()
            && own
                .iter()
                .all(|p| !p.iter().any(|x| x.starts_with("resourceVersion"))),
        "the agent's Node is read consistently: {own:?}"
    );
    let control_planes = reads("/api/v1/nodes");
    assert!(
        !control_planes.is_empty()
            && control_planes.iter().all(
                |p| from_cache(p) && p.iter().any(|x| x == "resourceVersionMatch=NotOlderThan")
            ),
        "the control-plane Nodes are listed from the cache as it is: {control_planes:?}"
    );
    // And the step still ran to its result.
    assert_one_run_with_its_result(&fake);
}

/// The standing NodeReport woken with the facts a finished task just read writes those: it
/// does not read the Node (nor the host) again. Woken without facts (its period), it reads
/// them itself.
#[tokio::test]
async fn the_report_writes_the_facts_it_was_woken_with() {
    let (fake, agent, _dir) = setup(running_task(), 0, |_| false);
    let node_reads = |fake: &Fake| {
        fake.seen()
            .iter()
            .filter(|s| s.method == "GET" && s.path == "/api/v1/nodes/w1")
            .count()
    };
    let facts = bosun_agent::facts::collect(&agent).await;
    let before = node_reads(&fake);
    agent.report_now.wake(Some(facts.clone()));
    let mut last = None;
    assert!(
        bosun_agent::report::report_once(&agent, &mut last)
            .await
            .unwrap()
    );
    assert_eq!(node_reads(&fake), before, "the report read the Node again");
    assert_eq!(
        last.as_ref(),
        Some(&facts),
        "the report wrote the facts it was given"
    );
    let written = fake
        .seen()
        .into_iter()
        .rfind(|s| s.method == "PATCH" && s.path == "/apis/bosun.dev/v1alpha1/nodereports/w1")
        .expect("the report was written");
    assert_eq!(
        written.body["spec"]["facts"],
        serde_json::to_value(&facts).unwrap()
    );

    // Its period: no facts given, so it reads them (and, unchanged, writes nothing).
    assert!(
        !bosun_agent::report::report_once(&agent, &mut last)
            .await
            .unwrap()
    );
    assert_eq!(node_reads(&fake), before + 1);
}
