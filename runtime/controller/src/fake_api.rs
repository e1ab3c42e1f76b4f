//! A fake API server for unit tests: a `tower::service_fn` behind a real kube `Client`
//! that answers every request with one NodeTask (or a 500 for the requests a test picks)
//! and records what was sent, so a test can check which writes a reconcile step makes, in
//! which order, and what happens when one fails.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bosun_api::node_task::NodeTask;
use kube::Client;
use kube::client::Body;
use serde_json::json;

use crate::reconcile::Context;

/// One request the fake API server saw: method, path, query, body.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path: String,
    /// The query string (`fieldManager=...&force=true` for a server-side apply).
    pub query: String,
    pub body: serde_json::Value,
}

impl Seen {
    /// A JSON Patch of a NodeTask removing `spec.recovery`.
    pub fn is_clear(&self) -> bool {
        self.method == "PATCH"
            && !self.path.ends_with("/status")
            && self.body.as_array().is_some_and(|ops| {
                ops.iter()
                    .any(|o| o["op"] == "remove" && o["path"] == "/spec/recovery")
            })
    }
    /// A patch of a NodeTask's status subresource.
    pub fn is_status(&self) -> bool {
        self.method == "PATCH" && self.path.ends_with("/status")
    }
    /// The field manager named in the query, if any.
    pub fn field_manager(&self) -> Option<&str> {
        self.query
            .split('&')
            .find_map(|kv| kv.strip_prefix("fieldManager="))
    }
}

/// A fake API server answering every NodeTask patch with `task`, except that requests
/// matching `fail` get a 500. Records every request.
pub fn fake(task: &NodeTask, fail: fn(&Seen) -> bool) -> (Client, Arc<Mutex<Vec<Seen>>>) {
    fake_failing_with(task, fail, 500)
}

/// [`fake`], with the failing requests answered with HTTP status `code` (422 is what the
/// API server answers a JSON Patch whose `test` fails).
pub fn fake_failing_with(
    task: &NodeTask,
    fail: fn(&Seen) -> bool,
    code: u16,
) -> (Client, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let reply = serde_json::to_vec(task).unwrap();
    let service = tower::service_fn(move |req: http::Request<Body>| {
        let log = log.clone();
        let reply = reply.clone();
        async move {
            let method = req.method().to_string();
            let path = req.uri().path().to_owned();
            let query = req.uri().query().unwrap_or_default().to_owned();
            let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
            let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
            let request = Seen {
                method,
                path,
                query,
                body,
            };
            let failed = fail(&request);
            log.lock().unwrap().push(request);
            let response = if failed {
                let (message, reason) = if code == 500 {
                    ("etcd is unavailable", "InternalError")
                } else {
                    ("the request was refused", "Invalid")
                };
                let status = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason, "code": code });
                http::Response::builder()
                    .status(code)
                    .body(Body::from(serde_json::to_vec(&status).unwrap()))
            } else {
                http::Response::builder()
                    .status(200)
                    .body(Body::from(reply))
            };
            Ok::<_, std::convert::Infallible>(response.unwrap())
        }
    });
    (Client::new(service, "default"), seen)
}

/// A fake API server answering every request with 200 and the JSON `route` returns for
/// it (so a test can serve a Node list, a NodeTask list and an Operation from one server).
/// Records every request.
pub fn fake_routes(route: fn(&Seen) -> serde_json::Value) -> (Client, Arc<Mutex<Vec<Seen>>>) {
    fake_answers(move |req| (200, route(req)))
}

/// [`fake_routes`], with the HTTP status of each answer chosen by `route` too (a `Status`
/// body for an error, as the API server sends).
pub fn fake_answers(
    route: impl Fn(&Seen) -> (u16, serde_json::Value) + Clone + Send + 'static,
) -> (Client, Arc<Mutex<Vec<Seen>>>) {
    fake_answers_held(route, |_| false, Arc::new(tokio::sync::Semaphore::new(0)))
}

/// [`fake_answers`], answering the requests `held` picks only once `gate` gives a permit
/// (one per request; they are recorded at once): an API server that is slow to answer one
/// kind of request for exactly as long as a test wants, with no clock involved.
pub fn fake_answers_held(
    route: impl Fn(&Seen) -> (u16, serde_json::Value) + Clone + Send + 'static,
    held: fn(&Seen) -> bool,
    gate: Arc<tokio::sync::Semaphore>,
) -> (Client, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let service = tower::service_fn(move |req: http::Request<Body>| {
        let log = log.clone();
        let route = route.clone();
        let gate = gate.clone();
        async move {
            let method = req.method().to_string();
            let path = req.uri().path().to_owned();
            let query = req.uri().query().unwrap_or_default().to_owned();
            let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
            let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
            let request = Seen {
                method,
                path,
                query,
                body,
            };
            let (code, reply) = route(&request);
            let hold = held(&request);
            log.lock().unwrap().push(request);
            if hold {
                gate.acquire().await.expect("the gate stays open").forget();
            }
            let response = http::Response::builder()
                .status(code)
                .body(Body::from(serde_json::to_vec(&reply).unwrap()));
            Ok::<_, std::convert::Infallible>(response.unwrap())
        }
    });
    (Client::new(service, "default"), seen)
}

/// The spec of a NodeTask of `operation` on `node`, group `g`, with no steps (tests add
/// the steps they need).
pub fn task_spec(operation: &str, node: &str) -> bosun_api::node_task::NodeTaskSpec {
    bosun_api::node_task::NodeTaskSpec {
        operation: operation.into(),
        node_name: node.into(),
        group: "g".into(),
        steps: vec![],
        dry_run: false,
        step_timeout_seconds: None,
        approve: false,
        recovery: None,
    }
}

/// A Node `name` whose Ready condition is True, as the Node watch would show it.
pub fn ready_node(name: &str) -> k8s_openapi::api::core::v1::Node {
    serde_json::from_value(
        json!({ "apiVersion": "v1", "kind": "Node", "metadata": { "name": name },
        "status": { "conditions": [{ "type": "Ready", "status": "True" }] } }),
    )
    .unwrap()
}

/// A controller context on `client` (no instance, field manager `bosun-controller`), with
/// Node and NodeTask stores listed empty.
pub fn context(client: Client) -> Context {
    Context {
        client: client.clone(),
        manager: "bosun-controller".into(),
        resync: Duration::from_secs(30),
        instance: None,
        policies: Default::default(),
        events: Arc::new(crate::events::Events::new(client, "test".into())),
        exclusion: Default::default(),
        waiters: Default::default(),
        own_writes: Default::default(),
        caches: Arc::new(crate::cache::Caches::listed(vec![], vec![])),
        inflight: Default::default(),
        retrigger: None,
        gates: Default::default(),
    }
}
