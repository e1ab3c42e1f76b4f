//! What the Operation reconciler reads Nodes and NodeTasks from: two watch-backed stores
//! (kube-runtime reflectors), not a LIST per reconcile. With a LIST of every Node and every
//! NodeTask in each reconcile, the controller's work per node grew with the fleet
//! (docs/benchmarks.md, fleet scale).
//!
//! - The Node store is fed by its own watch ([`Caches::nodes_watch`]). Node changes trigger
//!   no reconcile (as before).
//! - The NodeTask store is fed by the watch that already triggers reconciles
//!   ([`Caches::task_triggers`], given to the `Controller` with `watches_stream`): one watch
//!   of the instance's NodeTasks, the store updated before the event reaches the trigger
//!   mapping, deletions included.
//!
//! **Reading its own writes.** A store lags the API server by the time a watch event takes
//! to arrive, and a reconcile must never decide from a state older than the controller's
//! own earlier writes: a task it moved to Running (or finished) seen Pending again would be
//! started again, a step run twice. So every NodeTask write the controller makes is
//! recorded ([`Caches::recording`] wraps the reconciler's client and notes the
//! `resourceVersion` of each NodeTask write's response), and [`Caches::tasks`] first waits
//! until the store has seen a `resourceVersion` at least as new (one watch delivers a
//! resource's events in `resourceVersion` order, so the store is then a state that
//! includes every write made before the read). Resource versions are compared as integers
//! (the etcd revision; Kubernetes guarantees the format and order since 1.35, KEP-5504, and
//! earlier API servers already gave it). When a version is not such an integer, or the
//! store has not caught up within [`CATCH_UP`] (its watch broken, or a relist that no longer
//! shows the written object), the read goes to the API server as before.
//!
//! Other writers (the agents, people) are seen when their watch event arrives: the same as
//! a LIST made a moment earlier. Nodes are read without waiting: the controller's own Node
//! writes (cordon, uncordon) read and patch the Node itself, and the planner's and the
//! policies' view of a Node a moment old is what a LIST gave too.
//!
//! Both stores must have been listed once before a reconcile reads them ([`Caches::ready`]);
//! they are built by [`crate::run`], so a controller that becomes leader lists them before
//! its first reconcile.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bosun_api::node_task::NodeTask;
use bosun_api::operation::Operation;
use bosun_cluster::watch::Liveness;
use bosun_telemetry::Watched;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::client::Body;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource};

use crate::error::{Error, Result};

/// How long [`Caches::tasks`] waits for the NodeTask store to show the controller's own
/// last write before reading from the API server instead. Normally the wait is the time
/// one watch event takes (milliseconds); this bounds it when the watch is broken.
pub const CATCH_UP: Duration = Duration::from_secs(5);

/// How long a reconcile waits for the stores' first list before it gives up and looks again
/// later ([`Caches::ready`]).
pub const LIST_WAIT: Duration = Duration::from_secs(10);

/// The reconciler's watch-backed Nodes and NodeTasks (see the module documentation).
pub struct Caches {
    nodes: Store<Node>,
    tasks: Store<NodeTask>,
    node_writer: Mutex<Option<Writer<Node>>>,
    task_writer: Mutex<Option<Writer<NodeTask>>>,
    /// The newest NodeTask `resourceVersion` the store holds (0: none yet).
    seen: Arc<tokio::sync::watch::Sender<u64>>,
    /// The newest version of a relist under way (see [`observe`]).
    listing: Arc<Mutex<u64>>,
    /// The newest `resourceVersion` of the controller's own NodeTask writes, and whether
    /// one could not be read as an integer (then every read goes to the API server).
    written: Arc<Written>,
    catch_up: Duration,
    /// Whether the NodeTask watch still delivers ([`Caches::keep_tasks_fresh`]).
    task_liveness: Liveness,
}

/// The newest `resourceVersion` of the controller's NodeTask writes, by the Operation of
/// the task written (one entry per Operation whose tasks this process wrote).
#[derive(Debug, Default)]
struct Written {
    newest: Mutex<BTreeMap<String, u64>>,
    uncomparable: AtomicBool,
}

/// Whose writes a read must see: those to the tasks of one Operation, or those to the
/// tasks of every other Operation (the exclusion check reads only other Operations' tasks,
/// so it need not wait for the watch to bring back the write its own reconcile just made).
#[derive(Clone, Copy, Debug)]
pub enum Writes<'a> {
    Of(&'a str),
    NotOf(&'a str),
}

impl Written {
    fn record(&self, operation: &str, resource_version: Option<&str>) {
        match resource_version.map(parse_version) {
            Some(Some(v)) => {
                let mut newest = self.newest.lock().unwrap_or_else(PoisonError::into_inner);
                let mark = newest.entry(operation.to_owned()).or_default();
                *mark = (*mark).max(v);
            }
            Some(None) if !self.uncomparable.swap(true, Ordering::SeqCst) => {
                tracing::warn!(
                    resource_version = resource_version.unwrap_or(""),
                    "a NodeTask resourceVersion is not an integer: NodeTasks are read from the API server, not the cache"
                );
            }
            Some(None) | None => {}
        }
    }

    /// The newest version of the writes `which` names (0: none).
    fn newest(&self, which: Writes<'_>) -> u64 {
        let newest = self.newest.lock().unwrap_or_else(PoisonError::into_inner);
        newest
            .iter()
            .filter(|(op, _)| match which {
                Writes::Of(o) => op.as_str() == o,
                Writes::NotOf(o) => op.as_str() != o,
            })
            .map(|(_, v)| *v)
            .max()
            .unwrap_or(0)
    }
}

impl std::fmt::Debug for Caches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caches")
            .field("seen", &*self.seen.borrow())
            .field("written", &self.written)
            .finish_non_exhaustive()
    }
}

impl Default for Caches {
    fn default() -> Self {
        Caches::new()
    }
}

/// A `resourceVersion` as the integer it is (a positive decimal without leading zeros).
fn parse_version(rv: &str) -> Option<u64> {
    if rv.starts_with('0') || !rv.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    rv.parse().ok().filter(|v| *v > 0)
}

fn version_of<K: Resource>(obj: &K) -> Option<u64> {
    obj.meta()
        .resource_version
        .as_deref()
        .and_then(parse_version)
}

/// How many NodeTasks one page of [`Caches::tasks`]' read from the API server holds.
const FALLBACK_PAGE: u32 = 100;

/// Whether a request is a write of NodeTasks (create, patch, update, delete), whose
/// response's `resourceVersion` the reconciler must see in its store before it reads.
fn is_task_write(req: &http::Request<Body>) -> bool {
    let path = req.uri().path();
    req.method() != http::Method::GET
        && path.starts_with(&format!("/apis/{}/", NodeTask::group(&())))
        && path.split('/').any(|s| s == NodeTask::plural(&()))
}

impl Caches {
    /// Empty stores: [`Caches::nodes_watch`] and [`Caches::task_triggers`] fill them.
    pub fn new() -> Caches {
        let (nodes, node_writer) = reflector::store();
        let (tasks, task_writer) = reflector::store();
        Caches {
            nodes,
            tasks,
            node_writer: Mutex::new(Some(node_writer)),
            task_writer: Mutex::new(Some(task_writer)),
            seen: Arc::new(tokio::sync::watch::Sender::new(0)),
            listing: Default::default(),
            written: Default::default(),
            catch_up: CATCH_UP,
            task_liveness: Liveness::new(Watched::NodeTasks),
        }
    }

    /// Keeps the NodeTask watch honest while polled (never ends): when it has been silent
    /// while an agent step runs, the running tasks are read from the API server, and the
    /// watch is opened again if it missed a change (`bosun_cluster::watch::keep_fresh`).
    /// An agent's step result is the change the controller waits on without any write of
    /// its own to wait for (its own writes are covered by [`Caches::tasks`]' catch-up).
    pub fn keep_tasks_fresh(&self, client: Client) -> impl Future<Output = ()> + Send + 'static {
        bosun_cluster::watch::keep_fresh(
            Api::<NodeTask>::all(client),
            self.tasks.clone(),
            self.task_liveness.clone(),
            bosun_cluster::watch::FRESHNESS,
            NodeTask::agent_step_running,
        )
    }

    /// `client`, noting the `resourceVersion` of every NodeTask write it makes (for
    /// [`Caches::tasks`]). Give it to the reconciler; the watches use the plain client.
    pub fn recording(&self, client: Client) -> Client {
        let written = self.written.clone();
        let default_ns = client.default_namespace().to_owned();
        let service = tower::service_fn(move |req: http::Request<Body>| {
            let (client, written) = (client.clone(), written.clone());
            async move {
                let write = is_task_write(&req);
                let response = client.send(req).await?;
                if !write || !response.status().is_success() {
                    return Ok::<_, kube::Error>(response);
                }
                let (parts, body) = response.into_parts();
                let bytes = body.collect_bytes().await?;
                let object = serde_json::from_slice::<serde_json::Value>(&bytes).ok();
                let field = |p: &str| {
                    object
                        .as_ref()
                        .and_then(|o| o.pointer(p))
                        .and_then(|v| v.as_str())
                };
                written.record(
                    field("/spec/operation").unwrap_or(""),
                    field("/metadata/resourceVersion"),
                );
                Ok(http::Response::from_parts(parts, Body::from(bytes)))
            }
        });
        Client::new(service, default_ns)
    }

    /// Keeps the Node store current while polled (never ends). The first call gets it.
    pub fn nodes_watch(&self, client: Client) -> Option<impl Future<Output = ()> + Send + 'static> {
        let writer = self.node_writer.lock().ok()?.take()?;
        let api: Api<Node> = Api::all(client);
        Some(
            watcher(api, bosun_cluster::watch::controller_config())
                .inspect(bosun_cluster::watch::count_lists(Watched::Nodes))
                .backoff(bosun_cluster::watch::WatchBackoff::new(
                    bosun_cluster::watch::seed_of("bosun-controller/nodes"),
                ))
                .modify(slim_node)
                .reflect(writer)
                .for_each(|event| async move {
                    if let Err(e) = event {
                        tracing::warn!(error = %e, "watching Nodes failed; retrying");
                    }
                }),
        )
    }

    /// The NodeTasks matching `config`, for the controller's `watches_stream`: every change
    /// (deletions included) after the store holds it. The first call gets it. No backoff of
    /// its own: the controller's trigger backoff applies to it.
    pub fn task_triggers(
        &self,
        client: Client,
        config: watcher::Config,
    ) -> Option<impl Stream<Item = std::result::Result<NodeTask, watcher::Error>> + Send + 'static>
    {
        let writer = self.task_writer.lock().ok()?.take()?;
        let (seen, listing) = (self.seen.clone(), self.listing.clone());
        let api: Api<NodeTask> = Api::all(client);
        Some(
            bosun_cluster::watch::reopenable(api, config, self.task_liveness.clone())
                .modify(|t: &mut NodeTask| t.metadata.managed_fields = None)
                .reflect(writer)
                .inspect(move |event| {
                    if let Ok(event) = event {
                        let mut listing = listing
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        observe(&seen, &mut listing, event);
                    }
                })
                .touched_objects(),
        )
    }

    /// Waits up to `wait` for both stores' first list; false when they are not listed yet.
    pub async fn ready(&self, wait: Duration) -> bool {
        let both = async {
            self.nodes.wait_until_ready().await.is_ok()
                && self.tasks.wait_until_ready().await.is_ok()
        };
        tokio::time::timeout(wait, both).await == Ok(true)
    }

    /// Every Node in the store.
    pub fn nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.state()
    }

    /// The Node `name` as the store holds it, if it does.
    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(&ObjectRef::new(name))
    }

    /// The NodeTasks (of this instance) that `keep` accepts, as of a moment no earlier than
    /// the controller's last NodeTask write of those `after` names: from the store once it
    /// has caught up with that write, else (see [`CATCH_UP`]) from the API server with
    /// `selector`, a label selector that matches at least those tasks.
    pub async fn tasks(
        &self,
        client: &Client,
        after: Writes<'_>,
        selector: &str,
        keep: impl Fn(&NodeTask) -> bool,
    ) -> Result<Vec<Arc<NodeTask>>> {
        if self.caught_up(after).await {
            return Ok(self.tasks.state_filter(|t| keep(t)));
        }
        // In pages, each kept as the store keeps tasks (without managedFields): a thousand
        // tasks listed at once, each with the managedFields of its five writers, cost the
        // controller about 30 MB at the moment it could least afford it (a watch behind
        // under load; docs/benchmarks.md, fleet). The pages of one list are one snapshot:
        // the API server reads every page at the first one's resourceVersion.
        let api: Api<NodeTask> = Api::all(client.clone());
        let mut params = ListParams::default().labels(selector).limit(FALLBACK_PAGE);
        let mut tasks = Vec::new();
        loop {
            let page = api
                .list(&params)
                .await
                .map_err(Error::kube("listing NodeTasks"))?;
            tasks.extend(page.items.into_iter().filter(|t| keep(t)).map(|mut t| {
                t.metadata.managed_fields = None;
                Arc::new(t)
            }));
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(next) => params = params.continue_token(&next),
                None => return Ok(tasks),
            }
        }
    }

    /// Whether the task store holds every NodeTask write of `which` the controller made so
    /// far, waiting up to `catch_up` for it. (One watch delivers every task's events in
    /// order: once it showed a version, it showed every earlier write.)
    pub(crate) async fn caught_up(&self, which: Writes<'_>) -> bool {
        if self.written.uncomparable.load(Ordering::SeqCst) {
            return false;
        }
        let want = self.written.newest(which);
        let mut seen = self.seen.subscribe();
        let caught = tokio::time::timeout(self.catch_up, seen.wait_for(|s| *s >= want))
            .await
            .is_ok_and(|r| r.is_ok());
        if !caught {
            tracing::warn!(
                want,
                seen = *self.seen.borrow(),
                waited = ?self.catch_up,
                "the NodeTask watch has not shown this controller's last write yet; reading NodeTasks from the API server"
            );
        }
        caught
    }
}

/// The Operations as the controller's own last status write of each left them (the API
/// server's answer to the write), until the Operation watch shows that write.
///
/// The Operation a reconcile gets comes from the controller's Operation watch, and a
/// NodeTask event can trigger a reconcile before that watch delivered the status the
/// previous reconcile wrote. The reconcile would then compare the status it computes with
/// an older one and write the same status again: a write that changes nothing. With
/// [`OwnWrites::newest`] it starts from its own last write instead. An entry is dropped by
/// the first reconcile that sees the watch at that version or later (every status write
/// triggers one).
#[derive(Debug, Default)]
pub struct OwnWrites {
    last: Mutex<BTreeMap<String, Arc<Operation>>>,
}

impl OwnWrites {
    /// Keeps `written`, the answer to a status write, if its `resourceVersion` is an integer
    /// (else a reconcile cannot tell which is newer, and uses the watch's as before).
    pub fn record(&self, written: Operation) {
        if version_of(&written).is_none() {
            return;
        }
        let name = written.meta().name.clone().unwrap_or_default();
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        last.insert(name, Arc::new(written));
    }

    /// `seen`, the Operation as the watch last showed it, or the controller's own later
    /// status write of the same object when the watch has not shown that write yet.
    pub fn newest(&self, seen: Arc<Operation>) -> Arc<Operation> {
        let name = seen.meta().name.clone().unwrap_or_default();
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(mine) = last.get(&name) else {
            return seen;
        };
        let same_object = mine.meta().uid == seen.meta().uid;
        match (version_of(mine.as_ref()), version_of(seen.as_ref())) {
            (Some(m), Some(s)) if same_object && m > s => mine.clone(),
            _ => {
                last.remove(&name);
                seen
            }
        }
    }
}

/// What the Node store keeps of a Node: everything but what no reader of the store uses
/// and a fleet of Nodes would hold in memory for nothing (the field managers, the image
/// list, the volumes).
fn slim_node(node: &mut Node) {
    node.metadata.managed_fields = None;
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
    }
}

/// Moves the store's high-water mark for one watch event (after the store applied it).
/// During a relist (Init .. InitDone) the store still holds the old state: the mark is set
/// at InitDone to the newest version listed, lower than before if so (a relist may show
/// an older state than the last event; a reader then waits for newer events).
fn observe(
    seen: &tokio::sync::watch::Sender<u64>,
    listing: &mut u64,
    event: &watcher::Event<NodeTask>,
) {
    match event {
        watcher::Event::Apply(t) | watcher::Event::Delete(t) => {
            if let Some(v) = version_of(t) {
                seen.send_if_modified(|s| {
                    let newer = v > *s;
                    *s = (*s).max(v);
                    newer
                });
            }
        }
        watcher::Event::Init => *listing = 0,
        watcher::Event::InitApply(t) => *listing = (*listing).max(version_of(t).unwrap_or(0)),
        watcher::Event::InitDone => {
            let listed = std::mem::take(listing);
            seen.send_replace(listed);
        }
    }
}

#[cfg(test)]
impl Caches {
    /// Stores already listed with `nodes` and `tasks`, and what a watch showed so far.
    pub fn listed(nodes: Vec<Node>, tasks: Vec<NodeTask>) -> Caches {
        let caches = Caches::new();
        let mut node_writer = caches.node_writer.lock().unwrap().take().unwrap();
        node_writer.apply_watcher_event(&watcher::Event::Init);
        for n in nodes {
            node_writer.apply_watcher_event(&watcher::Event::InitApply(n));
        }
        node_writer.apply_watcher_event(&watcher::Event::InitDone);
        let writer = caches.task_writer.lock().unwrap().take().unwrap();
        let caches = Caches {
            task_writer: Mutex::new(Some(writer)),
            ..caches
        };
        caches.task_event(watcher::Event::Init);
        for t in tasks {
            caches.task_event(watcher::Event::InitApply(t));
        }
        caches.task_event(watcher::Event::InitDone);
        caches
    }

    /// Applies a NodeTask watch event as the trigger stream does.
    pub fn task_event(&self, event: watcher::Event<NodeTask>) {
        let mut writer = self.task_writer.lock().unwrap();
        let writer = writer.as_mut().unwrap();
        writer.apply_watcher_event(&event);
        observe(&self.seen, &mut self.listing.lock().unwrap(), &event);
    }

    /// Sets how long [`Caches::tasks`] waits for the store.
    pub fn with_catch_up(self, catch_up: Duration) -> Caches {
        Caches { catch_up, ..self }
    }
}

#[cfg(test)]
mod tests {
    use bosun_api::node_task::{NodeTaskPhase, NodeTaskStatus};
    use serde_json::json;

    use super::*;
    use kube::ResourceExt;

    fn task(name: &str, rv: &str, phase: NodeTaskPhase) -> NodeTask {
        let mut t = NodeTask::new(name, crate::fake_api::task_spec("op", name));
        t.metadata.resource_version = Some(rv.into());
        t.status = Some(NodeTaskStatus {
            phase,
            ..Default::default()
        });
        t
    }

    fn phases(tasks: &[Arc<NodeTask>]) -> Vec<(String, NodeTaskPhase)> {
        let mut out: Vec<_> = tasks
            .iter()
            .map(|t| (t.name_any(), t.status.as_ref().unwrap().phase))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    #[test]
    fn resource_versions_are_read_as_integers_or_not_at_all() {
        assert_eq!(parse_version("12345"), Some(12345));
        assert_eq!(parse_version("0"), None);
        assert_eq!(parse_version("012"), None);
        assert_eq!(parse_version(""), None);
        assert_eq!(parse_version("a1"), None);
        assert_eq!(parse_version("99999999999999999999999"), None);
    }

    /// The controller's own write (rv 12) is not in the store yet: the read waits for the
    /// watch event that brings it, and returns the state with it, from the store.
    #[tokio::test]
    async fn a_read_waits_for_the_store_to_show_the_controllers_own_write() {
        let caches = Arc::new(Caches::listed(
            vec![],
            vec![task("a", "10", NodeTaskPhase::Pending)],
        ));
        let (client, seen) = crate::fake_api::fake_routes(|_| json!({}));
        caches.written.record("op", Some("12"));
        let reader = {
            let caches = caches.clone();
            tokio::spawn(async move {
                caches
                    .tasks(&client, Writes::Of("op"), "", |_| true)
                    .await
                    .unwrap()
            })
        };
        tokio::task::yield_now().await;
        caches.task_event(watcher::Event::Apply(task(
            "b",
            "11",
            NodeTaskPhase::Pending,
        )));
        caches.task_event(watcher::Event::Apply(task(
            "a",
            "12",
            NodeTaskPhase::Running,
        )));
        let read = reader.await.unwrap();
        assert_eq!(
            phases(&read),
            [
                ("a".to_string(), NodeTaskPhase::Running),
                ("b".to_string(), NodeTaskPhase::Pending)
            ]
        );
        assert!(
            seen.lock().unwrap().is_empty(),
            "read from the store, not the API server"
        );
    }

    /// A store that does not catch up (here: no wait allowed) is not read: the tasks come
    /// from the API server.
    #[tokio::test]
    async fn a_store_behind_the_controllers_writes_is_not_read() {
        let caches = Caches::listed(vec![], vec![task("a", "10", NodeTaskPhase::Pending)])
            .with_catch_up(Duration::ZERO);
        caches.written.record("op", Some("12"));
        let (client, seen) = crate::fake_api::fake_routes(|_| {
            json!({ "kind": "NodeTaskList", "apiVersion": "bosun.dev/v1alpha1", "metadata": {}, "items": [
                serde_json::to_value(task("a", "12", NodeTaskPhase::Running)).unwrap()
            ] })
        });
        let read = caches
            .tasks(&client, Writes::Of("op"), "x=y", |_| true)
            .await
            .unwrap();
        assert_eq!(phases(&read), [("a".to_string(), NodeTaskPhase::Running)]);
        let requests = seen.lock().unwrap().clone();
        assert_eq!(requests.len(), 1, "{requests:#?}");
        assert_eq!(
            (requests[0].method.as_str(), requests[0].path.as_str()),
            ("GET", "/apis/bosun.dev/v1alpha1/nodetasks")
        );
    }

    /// The API server's tasks are read in pages of `FALLBACK_PAGE`, following the
    /// continue token, and kept as the store keeps them: without managedFields.
    #[tokio::test]
    async fn the_api_servers_tasks_are_read_in_pages_without_managed_fields() {
        let caches = Caches::listed(vec![], vec![]).with_catch_up(Duration::ZERO);
        caches.written.record("op", Some("12"));
        let (client, seen) = crate::fake_api::fake_routes(|req| {
            let managed = |name: &str, phase| {
                let mut t = serde_json::to_value(task(name, "12", phase)).unwrap();
                t["metadata"]["managedFields"] = json!([{
                    "manager": "bosun-agent", "operation": "Apply", "apiVersion": "bosun.dev/v1alpha1",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:phase": {}}}
                }]);
                t
            };
            let (items, next) = if req.query.contains("continue=page-2") {
                (vec![managed("b", NodeTaskPhase::Pending)], json!({}))
            } else {
                (
                    vec![managed("a", NodeTaskPhase::Running)],
                    json!({ "continue": "page-2" }),
                )
            };
            json!({ "kind": "NodeTaskList", "apiVersion": "bosun.dev/v1alpha1", "metadata": next, "items": items })
        });
        let read = caches
            .tasks(&client, Writes::Of("op"), "x=y", |_| true)
            .await
            .unwrap();
        assert_eq!(
            phases(&read),
            [
                ("a".to_string(), NodeTaskPhase::Running),
                ("b".to_string(), NodeTaskPhase::Pending)
            ]
        );
        assert!(
            read.iter().all(|t| t.metadata.managed_fields.is_none()),
            "{read:#?}"
        );
        let requests = seen.lock().unwrap().clone();
        assert_eq!(requests.len(), 2, "{requests:#?}");
        let limit = format!("limit={FALLBACK_PAGE}");
        assert!(
            requests.iter().all(|r| r.query.contains(&limit)),
            "{requests:#?}"
        );
        assert!(!requests[0].query.contains("continue="), "{requests:#?}");
        assert!(
            requests[1].query.contains("continue=page-2"),
            "{requests:#?}"
        );
    }

    /// A read of one Operation's tasks waits only for the writes of that Operation's tasks;
    /// the exclusion check's read of the others' tasks only for theirs.
    #[tokio::test]
    async fn a_read_waits_only_for_the_writes_it_names() {
        let caches = Caches::listed(vec![], vec![task("a", "10", NodeTaskPhase::Pending)])
            .with_catch_up(Duration::ZERO);
        caches.written.record("other", Some("12"));
        let (client, seen) = crate::fake_api::fake_routes(
            |_| json!({ "kind": "NodeTaskList", "apiVersion": "bosun.dev/v1alpha1", "metadata": {}, "items": [] }),
        );
        let own = caches
            .tasks(&client, Writes::Of("op"), "", |_| true)
            .await
            .unwrap();
        assert_eq!(phases(&own), [("a".to_string(), NodeTaskPhase::Pending)]);
        assert!(seen.lock().unwrap().is_empty(), "read from the store");
        let others = caches
            .tasks(&client, Writes::NotOf("op"), "", |_| true)
            .await
            .unwrap();
        assert!(others.is_empty(), "read from the API server's (empty) list");
        assert_eq!(seen.lock().unwrap().len(), 1);
        // Once the watch shows the other Operation's write, the store is read again.
        caches.task_event(watcher::Event::Apply(task(
            "b",
            "12",
            NodeTaskPhase::Running,
        )));
        let others = caches
            .tasks(&client, Writes::NotOf("op"), "", |_| true)
            .await
            .unwrap();
        assert_eq!(others.len(), 2);
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    /// A resourceVersion that is not an integer cannot be compared: reads go to the API
    /// server from then on.
    #[tokio::test]
    async fn an_unreadable_resource_version_sends_reads_to_the_api_server() {
        let caches = Caches::listed(vec![], vec![task("a", "10", NodeTaskPhase::Pending)]);
        caches.written.record("op", Some("opaque-7"));
        let (client, seen) = crate::fake_api::fake_routes(
            |_| json!({ "kind": "NodeTaskList", "apiVersion": "bosun.dev/v1alpha1", "metadata": {}, "items": [] }),
        );
        assert!(
            caches
                .tasks(&client, Writes::Of("op"), "", |_| true)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(seen.lock().unwrap().len(), 1);
    }

    /// The recording client notes the resourceVersion a NodeTask write returns, and only
    /// of NodeTask writes (not of reads, nor of other kinds).
    #[tokio::test]
    async fn the_recording_client_notes_the_version_of_nodetask_writes() {
        let (client, _) = crate::fake_api::fake_routes(|req| {
            let rv = if req.path.contains("/nodetasks") {
                "40"
            } else {
                "90"
            };
            json!({ "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeTask", "metadata": { "name": "a", "resourceVersion": rv }, "spec": {"operation": "op", "nodeName": "a", "group": "g", "steps": []} })
        });
        let caches = Caches::listed(vec![], vec![]);
        let client = caches.recording(client);
        let api: Api<NodeTask> = Api::all(client.clone());
        api.get("a").await.unwrap();
        assert_eq!(caches.written.newest(Writes::Of("op")), 0, "a read");
        let patch = json!({ "status": { "phase": "Running" } });
        api.patch_status(
            "a",
            &kube::api::PatchParams::apply("t"),
            &kube::api::Patch::Apply(&patch),
        )
        .await
        .unwrap();
        assert_eq!(caches.written.newest(Writes::Of("op")), 40);
        let nodes: Api<Node> = Api::all(client);
        let _ = nodes
            .patch(
                "a",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({})),
            )
            .await;
        assert_eq!(
            caches.written.newest(Writes::Of("op")),
            40,
            "a Node write is not a NodeTask write"
        );
    }

    /// After a relist the mark is the newest version listed, even when that is lower than
    /// the last event's (the relisted state is what the store holds now).
    #[test]
    fn a_relist_sets_the_mark_to_what_it_listed() {
        let caches = Caches::listed(vec![], vec![task("a", "10", NodeTaskPhase::Pending)]);
        assert_eq!(*caches.seen.borrow(), 10);
        caches.task_event(watcher::Event::Apply(task(
            "a",
            "20",
            NodeTaskPhase::Running,
        )));
        assert_eq!(*caches.seen.borrow(), 20);
        caches.task_event(watcher::Event::Delete(task(
            "a",
            "25",
            NodeTaskPhase::Running,
        )));
        assert_eq!(*caches.seen.borrow(), 25);
        caches.task_event(watcher::Event::Init);
        caches.task_event(watcher::Event::InitApply(task(
            "b",
            "15",
            NodeTaskPhase::Pending,
        )));
        assert_eq!(*caches.seen.borrow(), 25, "the old state until InitDone");
        caches.task_event(watcher::Event::InitDone);
        assert_eq!(*caches.seen.borrow(), 15);
    }
}
