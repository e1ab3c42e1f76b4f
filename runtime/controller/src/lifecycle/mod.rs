//! The ClusterLifecycle reconciler: the declarative layer on top of Operations.
//!
//! It watches the ClusterLifecycle `cluster`, the Nodes, the NodeReports and the
//! Operations it generated (by label), and on a change (see [`run`]) reads the
//! ClusterLifecycle and its generated Operations, takes the Nodes and NodeReports from the
//! watches' caches, asks [`decide::decide`] what to do, creates at most one Operation, and
//! writes the status when it changed. Operations stay the
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

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bosun_telemetry::Watched;
use futures::{Stream, StreamExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;
use tokio::time::Instant;

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
use decide::{Decision, Generated, Input, Kind, NodeObservation, RenewalValidity, decide};

/// The label every control-plane node carries.
const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// What the reconciler needs.
#[derive(Clone)]
pub struct Lifecycle {
    pub client: Client,
    pub manager: String,
    pub instance: Option<String>,
}

/// The shortest time between the starts of two reconciles: a burst of events (an upgrade
/// changing many Nodes and NodeReports at once) is one reconcile per second at most.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// The safety-net resync: a reconcile at least this often whatever the watches say
/// (`--resync-seconds` when that is longer).
pub const RESYNC: Duration = Duration::from_secs(300);

/// The first wait after a failed reconcile; it doubles up to the resync period.
const RETRY_FIRST: Duration = Duration::from_secs(2);

/// What the reconciler reads from the watches' caches: every Node and every NodeReport.
#[derive(Clone)]
pub struct Observed {
    pub nodes: Store<Node>,
    pub reports: Store<NodeReport>,
}

/// Runs the reconciler until the process ends: once the Node and NodeReport caches are
/// filled, then on every relevant change of the ClusterLifecycle, a Node (added, removed,
/// its kubelet version or control-plane label changed), a NodeReport, or a generated
/// Operation; at most once per [`MIN_INTERVAL`] (the changes meanwhile are one reconcile);
/// at the next time a certificate becomes due ([`decide::Decision::wake_at`]); and at
/// least once per `resync`. A failed reconcile is tried again after 2 s, doubling up to
/// `resync`.
pub async fn run(lifecycle: Lifecycle, resync: Duration) {
    let changed = Arc::new(Notify::new());
    let (nodes, node_writer) = reflector::store();
    let (reports, report_writer) = reflector::store();
    let observed = Observed { nodes, reports };
    let (lifecycle_triggers, lifecycle_fresh) = lifecycle_changes(&lifecycle);
    let (operation_triggers, operations_fresh) = operation_changes(&lifecycle);
    let triggers = futures::stream::select_all([
        lifecycle_triggers.boxed(),
        node_changes(&lifecycle.client, node_writer).boxed(),
        report_changes(&lifecycle.client, report_writer).boxed(),
        operation_triggers.boxed(),
    ]);
    let notify = Arc::clone(&changed);
    // Driven apart from the reconciles so that the caches stay current while one runs;
    // stopped with this function.
    let _watches = bosun_cluster::watch::AbortOnDrop(tokio::spawn(triggers.for_each(move |()| {
        // One stored permit: changes while a reconcile runs make exactly one more.
        notify.notify_one();
        async {}
    })));
    // A person's edit of the ClusterLifecycle, or a generated Operation's progress, is
    // seen even when the watch that should bring it reached an API server that stopped
    // delivering (`bosun_cluster::watch::keep_listed_fresh`).
    let _fresh = (
        bosun_cluster::watch::AbortOnDrop(tokio::spawn(lifecycle_fresh)),
        bosun_cluster::watch::AbortOnDrop(tokio::spawn(operations_fresh)),
    );
    if observed.nodes.wait_until_ready().await.is_err()
        || observed.reports.wait_until_ready().await.is_err()
    {
        tracing::error!(
            "the Node or NodeReport watch ended before its first list; the ClusterLifecycle is not reconciled"
        );
        return;
    }
    let mut adoption = Adoption::default();
    let mut validity = ValidityCache::default();
    let mut wake_at: Option<Timestamp> = None;
    let mut retry = RETRY_FIRST;
    loop {
        let started = Instant::now();
        let mut wait = resync;
        match lifecycle
            .pass(&observed, &mut adoption, &mut validity)
            .await
        {
            Ok(next) => {
                wake_at = next;
                retry = RETRY_FIRST;
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?retry, "ClusterLifecycle reconcile failed; trying again");
                wait = retry.min(resync);
                retry = (retry * 2).min(resync);
            }
        }
        if let Some(at) = wake_at {
            let until = at.duration_since(Timestamp::now());
            // Past or now: at once (the next pass sees it due); a second late at most.
            let until = Duration::try_from(until).unwrap_or_default() + Duration::from_secs(1);
            wait = wait.min(until);
        }
        tokio::select! {
            () = changed.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
        tokio::time::sleep_until(started + MIN_INTERVAL).await;
    }
}

/// One item per change of the ClusterLifecycle `cluster` (any instance's: `pass` decides
/// whether it is ours), and the check that keeps that watch honest.
fn lifecycle_changes(
    lifecycle: &Lifecycle,
) -> (
    impl Stream<Item = ()> + Send + 'static,
    impl Future<Output = ()> + Send + 'static,
) {
    let api: Api<ClusterLifecycle> = Api::all(lifecycle.client.clone());
    let config = bosun_cluster::watch::controller_config().fields(&format!("metadata.name={NAME}"));
    listed_fresh_triggers("ClusterLifecycle", api, config, Watched::ClusterLifecycles)
}

/// One item per change of a generated Operation of this instance, and the check that
/// keeps that watch honest.
fn operation_changes(
    lifecycle: &Lifecycle,
) -> (
    impl Stream<Item = ()> + Send + 'static,
    impl Future<Output = ()> + Send + 'static,
) {
    let api: Api<Operation> = Api::all(lifecycle.client.clone());
    let config = bosun_cluster::watch::controller_config().labels(&lifecycle.generated_selector());
    listed_fresh_triggers("generated Operations", api, config, Watched::Operations)
}

/// [`triggers`] of a watch of `api`'s objects with `config` that is opened again when a
/// list with the same selectors shows what it did not bring
/// (`bosun_cluster::watch::keep_listed_fresh`); the second half runs that check.
fn listed_fresh_triggers<K>(
    what: &'static str,
    api: Api<K>,
    config: watcher::Config,
    resource: Watched,
) -> (
    impl Stream<Item = ()> + Send + 'static,
    impl Future<Output = ()> + Send + 'static,
)
where
    K: bosun_cluster::watch::Watchable,
{
    let liveness = bosun_cluster::watch::Liveness::new(resource);
    let (events, store) =
        bosun_cluster::watch::reflected(api.clone(), config.clone(), liveness.clone());
    let fresh = bosun_cluster::watch::keep_listed_fresh(
        api,
        config,
        store,
        liveness,
        bosun_cluster::watch::LISTED_FRESHNESS,
    );
    (triggers(what, events), fresh)
}

/// Keeps the NodeReport cache; one item per change of a NodeReport (agents write only
/// when their facts changed).
fn report_changes(
    client: &Client,
    writer: reflector::store::Writer<NodeReport>,
) -> impl Stream<Item = ()> + Send + 'static {
    let api: Api<NodeReport> = Api::all(client.clone());
    triggers(
        "NodeReports",
        reflector::reflector(
            writer,
            watcher(api, bosun_cluster::watch::controller_config()),
        ),
    )
}

/// Keeps the Node cache; one item per Node added or removed or whose kubelet version or
/// control-plane label changed. A Node's status is rewritten every few minutes (and its
/// conditions on every change), which matters here only when the version does.
fn node_changes(
    client: &Client,
    writer: reflector::store::Writer<Node>,
) -> impl Stream<Item = ()> + Send + 'static {
    let api: Api<Node> = Api::all(client.clone());
    let mut seen = NodeChanges::default();
    reflector::reflector(
        writer,
        watcher(api, bosun_cluster::watch::controller_config()),
    )
    .backoff(bosun_cluster::watch::WatchBackoff::new(
        bosun_cluster::watch::seed_of("bosun.dev/lifecycle/Node"),
    ))
    .filter_map(move |event| {
        let changed = match event {
            Ok(event) => seen.changed(&event),
            Err(e) => {
                tracing::warn!(error = %e, "watching Nodes failed; retrying");
                false
            }
        };
        std::future::ready(changed.then_some(()))
    })
}

/// What the decision read of each Node last seen: its control-plane label and kubelet
/// version, by name.
#[derive(Debug, Default)]
pub struct NodeChanges(HashMap<String, (bool, Option<String>)>);

impl NodeChanges {
    /// Whether `event` changes what the decision reads: a Node added or removed, its
    /// kubelet version or control-plane label changed, or a (re)list done. A status
    /// rewrite that changes neither (heartbeats, conditions, images) is not a change.
    pub fn changed(&mut self, event: &watcher::Event<Node>) -> bool {
        match event {
            watcher::Event::Apply(node) | watcher::Event::InitApply(node) => {
                let facts = (
                    node.labels().contains_key(CONTROL_PLANE_LABEL),
                    kubelet_version(node),
                );
                self.0.insert(node.name_any(), facts.clone()) != Some(facts)
            }
            watcher::Event::Delete(node) => self.0.remove(&node.name_any()).is_some(),
            watcher::Event::InitDone => true,
            watcher::Event::Init => false,
        }
    }
}

fn kubelet_version(node: &Node) -> Option<String> {
    node.status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.kubelet_version.clone())
        .filter(|v| !v.is_empty())
}

/// `events` with the project's watch backoff, one item per change (an object applied or
/// deleted, or a (re)list done); errors are logged and the watch opened again.
fn triggers<K>(
    what: &'static str,
    events: impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
) -> impl Stream<Item = ()> + Send + 'static
where
    K: Send + 'static,
{
    events
        .backoff(bosun_cluster::watch::WatchBackoff::new(
            bosun_cluster::watch::seed_of(what),
        ))
        .filter_map(move |event| {
            std::future::ready(match event {
                Ok(
                    watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone,
                ) => Some(()),
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => None,
                Err(e) => {
                    tracing::warn!(error = %e, "watching {what} failed; retrying");
                    None
                }
            })
        })
}

impl std::fmt::Debug for Lifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lifecycle")
            .field("manager", &self.manager)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

/// How long a read of kubeadm's certificate validity is used before it is read again.
const VALIDITY_TTL: Duration = Duration::from_secs(300);

/// kubeadm's certificate validity ([`RenewalValidity`]) as last read from the
/// `kubeadm-config` ConfigMap, and when: read again at most every [`VALIDITY_TTL`], so a
/// reconcile costs no extra request most of the time.
#[derive(Clone, Copy, Debug, Default)]
pub struct ValidityCache(Option<(Instant, RenewalValidity)>);

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

    /// The label selector of the Operations this install's ClusterLifecycles generated (of
    /// any uid: [`is_own`] picks the current one's).
    fn generated_selector(&self) -> String {
        format!(
            "{},{}",
            bosun_cluster::instance_selector(self.instance.as_deref()),
            labels::LIFECYCLE
        )
    }

    /// One pass: adopt (once) or reconcile. Returns when to decide again by time alone
    /// (a certificate becoming due), if ever.
    pub async fn pass(
        &self,
        observed: &Observed,
        adoption: &mut Adoption,
        validity: &mut ValidityCache,
    ) -> Result<Option<Timestamp>> {
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
            return Ok(None);
        };
        adoption.done = true;
        if !self.ours(&object) {
            tracing::debug!("ClusterLifecycle cluster belongs to another instance; left alone");
            return Ok(None);
        }
        if object.metadata.deletion_timestamp.is_some() {
            return Ok(None);
        }
        let renewal_validity = self.renewal_validity(validity).await?;
        self.reconcile(&object, observed, renewal_validity).await
    }

    /// kubeadm's certificate validity, from `cache` while it is younger than
    /// [`VALIDITY_TTL`], else from the `kubeadm-config` ConfigMap (kubeadm's default when
    /// the ConfigMap or the field is absent, or the field does not read as a duration).
    async fn renewal_validity(&self, cache: &mut ValidityCache) -> Result<RenewalValidity> {
        if let Some((at, v)) = cache.0
            && at.elapsed() < VALIDITY_TTL
        {
            return Ok(v);
        }
        let map = self.kubeadm_config().await?;
        let period = cluster_configuration_of(map.as_ref()).and_then(certificate_validity_of);
        let v = match period {
            Some(period) => RenewalValidity {
                period,
                from_config: true,
            },
            None => RenewalValidity::KUBEADM_DEFAULT,
        };
        cache.0 = Some((Instant::now(), v));
        Ok(v)
    }

    /// The ConfigMap `kube-system/kubeadm-config` kubeadm writes, if there is one.
    async fn kubeadm_config(&self) -> Result<Option<ConfigMap>> {
        let maps: Api<ConfigMap> = Api::namespaced(self.client.clone(), "kube-system");
        maps.get_opt("kubeadm-config")
            .await
            .map_err(Error::kube("getting ConfigMap kube-system/kubeadm-config"))
    }

    /// Creates the ClusterLifecycle from the cluster as it is. `Ok(false)` when the cluster
    /// does not say its version (no kubeadm-config ConfigMap): try again next pass.
    async fn adopt(&self, api: &Api<ClusterLifecycle>, warned: bool) -> Result<bool> {
        let map = self.kubeadm_config().await?;
        let version = cluster_configuration_of(map.as_ref()).and_then(kubernetes_version_of);
        let Some(version) = version else {
            if warned {
                return Ok(false);
            }
            let what = match &map {
                None => "there is no ConfigMap kube-system/kubeadm-config",
                Some(_) if cluster_configuration_of(map.as_ref()).is_none() => {
                    "ConfigMap kube-system/kubeadm-config has no ClusterConfiguration key"
                }
                Some(_) => {
                    "the ClusterConfiguration in ConfigMap kube-system/kubeadm-config has no kubernetesVersion like v1.34.4"
                }
            };
            tracing::warn!(
                "no ClusterLifecycle, and {what}: nothing to adopt yet (create the ClusterLifecycle by hand, or check the cluster was made by kubeadm)"
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

    async fn reconcile(
        &self,
        object: &ClusterLifecycle,
        observed: &Observed,
        renewal_validity: RenewalValidity,
    ) -> Result<Option<Timestamp>> {
        let now = Timestamp::now();
        let nodes = observe(&observed.nodes.state(), &observed.reports.state());
        let mut generated_ops = self.generated().await?;
        newest_first(&mut generated_ops);
        let generated: Vec<Generated> = generated_ops
            .iter()
            .filter(|op| is_own(op, object))
            .filter_map(generated_of)
            .collect();
        let stored = object.status.clone().unwrap_or_default();
        let mut decision = decide(&Input {
            spec: &object.spec,
            handled_rotation: stored.certificates.handled_rotation,
            nodes: &nodes,
            generated: &generated,
            renewal_validity,
            now,
        });
        let mut history = stored.history.clone();
        if let Some(g) = decision.generate.clone()
            && let Created::Taken(why) = self.create_operation(&g, object).await?
        {
            // Nothing was generated: the request (a rotation) stays unhandled, and the
            // condition says whose the name is and what to do.
            tracing::warn!(operation = %g.name, "{why}");
            decision.generate = None;
            decision.certificates.handled_rotation = stored.certificates.handled_rotation;
            decision.waiting = Some((decide::Waiting::NameTaken, why));
        }
        if let Some(g) = &decision.generate {
            record(&mut history, g, now);
        }
        let status = status_of(object, &stored, &decision, history, now);
        if status != stored {
            self.write_status(&status).await?;
        }
        Ok(decision.wake_at)
    }

    /// The Operations this install's ClusterLifecycle generated, by label.
    async fn generated(&self) -> Result<Vec<Operation>> {
        let ops: Api<Operation> = Api::all(self.client.clone());
        Ok(ops
            .list(&ListParams::default().labels(&self.generated_selector()))
            .await
            .map_err(Error::kube("listing generated Operations"))?
            .items)
    }

    /// Creates the Operation `g` for `object`. A name already taken is ours only when that
    /// Operation is [`is_own`] (an earlier pass created it and its status write was lost).
    async fn create_operation(
        &self,
        g: &decide::Generate,
        object: &ClusterLifecycle,
    ) -> Result<Created> {
        let mut labels_ =
            BTreeMap::from([(labels::LIFECYCLE.to_string(), g.kind.as_str().to_string())]);
        if let Some(uid) = &object.metadata.uid {
            labels_.insert(labels::LIFECYCLE_UID.into(), uid.clone());
        }
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
                Ok(Created::Created)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let existing = ops
                    .get_opt(&g.name)
                    .await
                    .map_err(Error::kube(format!("getting Operation {}", g.name)))?;
                Ok(match existing {
                    // Created by an earlier pass whose status write was lost.
                    Some(op) if is_own(&op, object) => Created::Created,
                    Some(op) => Created::Taken(name_taken(&op, &g.name)),
                    // Deleted since: the next pass creates it.
                    None => Created::Taken(format!(
                        "Operation {} was being deleted when this ClusterLifecycle generated it; it is generated again once it is gone",
                        g.name
                    )),
                })
            }
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

/// Every Node with its kubelet version, and the certificates and packages of its
/// NodeReport (matched by `spec.nodeName`).
pub fn observe(nodes: &[Arc<Node>], reports: &[Arc<NodeReport>]) -> Vec<NodeObservation> {
    let reports: BTreeMap<&str, &NodeReport> = reports
        .iter()
        .map(|r| (r.spec.node_name.as_str(), r.as_ref()))
        .collect();
    let mut out: Vec<NodeObservation> = nodes
        .iter()
        .map(|n| {
            let name = n.name_any();
            let report = reports.get(name.as_str());
            NodeObservation {
                control_plane: n.labels().contains_key(CONTROL_PLANE_LABEL),
                kubelet_version: kubelet_version(n),
                // Only entries an agent could have written (a forged `../../etc/shadow`
                // expiring in year 1 is not the cluster's earliest certificate).
                certificates: report.map(|r| {
                    r.spec
                        .facts
                        .certificates
                        .iter()
                        .filter(|c| c.is_plausible())
                        .cloned()
                        .collect()
                }),
                packages: report
                    .map(|r| r.spec.facts.packages.clone())
                    .unwrap_or_default(),
                reboot: report.and_then(|r| r.spec.facts.reboot.clone()),
                boot_id: report.and_then(|r| r.spec.facts.boot_id.clone()),
                name,
            }
        })
        .collect();
    // The caches hold no order; the summary names the first lagging node.
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
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
        reboots: d.reboots.clone(),
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

/// What creating a generated Operation did.
#[derive(Debug, PartialEq)]
enum Created {
    /// It exists now and is this ClusterLifecycle's.
    Created,
    /// Its name is taken by an Operation that is not this ClusterLifecycle's: why, and what
    /// to do.
    Taken(String),
}

/// Whether `op` is an Operation `lifecycle` generated: it carries the ClusterLifecycle's uid
/// ([`labels::LIFECYCLE_UID`]). An Operation of an earlier Bosun, which labelled its
/// Operations with [`labels::LIFECYCLE`] alone, counts when it was created after this
/// ClusterLifecycle (so not by an earlier ClusterLifecycle of the same name). Never by name.
pub fn is_own(op: &Operation, lifecycle: &ClusterLifecycle) -> bool {
    let labels = op.labels();
    if !labels.contains_key(labels::LIFECYCLE) {
        return false;
    }
    match (labels.get(labels::LIFECYCLE_UID), &lifecycle.metadata.uid) {
        (Some(uid), Some(own)) => uid == own,
        (Some(_), None) => false,
        (None, _) => match (
            &op.metadata.creation_timestamp,
            &lifecycle.metadata.creation_timestamp,
        ) {
            (Some(created), Some(since)) => created.0 >= since.0,
            _ => false,
        },
    }
}

/// The message for a generated Operation's name taken by `op`.
fn name_taken(op: &Operation, name: &str) -> String {
    let by = if op.labels().contains_key(labels::LIFECYCLE) {
        "was generated by an earlier ClusterLifecycle (deleted and created again since)"
    } else {
        "was not generated by a ClusterLifecycle (made by hand or by another tool)"
    };
    format!(
        "Operation {name} exists and {by}, so this ClusterLifecycle generates nothing under its name: look at it (kubectl bosun status {name}), then delete it (kubectl delete operation {name}) and the ClusterLifecycle generates its own"
    )
}

/// The ClusterConfiguration document in kubeadm's `kubeadm-config` ConfigMap.
fn cluster_configuration_of(map: Option<&ConfigMap>) -> Option<&str> {
    map?.data
        .as_ref()?
        .get("ClusterConfiguration")
        .map(String::as_str)
}

/// The value of the top-level `key:` line of kubeadm's ClusterConfiguration (a YAML
/// document, as kubeadm writes it: one key per line), quotes removed.
fn top_level_value<'a>(cluster_configuration: &'a str, key: &str) -> Option<&'a str> {
    cluster_configuration.lines().find_map(|line| {
        let value = line.strip_prefix(key)?.strip_prefix(':')?.trim();
        Some(value.trim_matches(|c| c == '"' || c == '\''))
    })
}

/// `kubernetesVersion` from kubeadm's ClusterConfiguration.
pub fn kubernetes_version_of(cluster_configuration: &str) -> Option<String> {
    let value = top_level_value(cluster_configuration, "kubernetesVersion")?;
    bosun_api::lifecycle::parse_version(value).map(|_| value.to_string())
}

/// `certificateValidityPeriod` (kubeadm v1beta4) from kubeadm's ClusterConfiguration: a Go
/// duration such as `8760h0m0s` or `240h`, whole hours, minutes and seconds (a fraction or a
/// unit below the second does not read, and kubeadm's default applies). `None` when absent,
/// unreadable or not positive.
pub fn certificate_validity_of(
    cluster_configuration: &str,
) -> Option<k8s_openapi::jiff::SignedDuration> {
    let value = top_level_value(cluster_configuration, "certificateValidityPeriod")?;
    bosun_api::lifecycle::sum_of_units(value, &[('h', 3_600), ('m', 60), ('s', 1)])
        .filter(|secs| *secs > 0)
        .map(k8s_openapi::jiff::SignedDuration::from_secs)
}

/// Sorts `ops` newest first (by creation time, then name): the decision reads the last
/// reboot of a node as the first it finds.
fn newest_first(ops: &mut [Operation]) {
    let key = |op: &Operation| {
        (
            op.metadata.creation_timestamp.as_ref().map(|t| t.0),
            op.name_any(),
        )
    };
    ops.sort_by_key(|op| std::cmp::Reverse(key(op)));
}

/// What the decision needs to know of one generated Operation: its kind (`None` for an
/// Operation of none of the kinds the lifecycle generates), phase and progress, what holds
/// it, and the reason it was generated for.
fn generated_of(op: &Operation) -> Option<Generated> {
    use bosun_policy::input::OperationKind;
    let kind = match bosun_cluster::readers::operation_kind(op) {
        OperationKind::Upgrade => Kind::Upgrade,
        OperationKind::RenewCertificates => Kind::RenewCertificates,
        OperationKind::Reboot => Kind::Reboot,
        OperationKind::Custom => return None,
    };
    let status = op.status.clone().unwrap_or_default();
    let true_condition = |type_: &str, reason: Option<&str>| {
        status
            .conditions
            .iter()
            .find(|c| {
                c.type_ == type_ && c.status == "True" && reason.is_none_or(|r| c.reason == r)
            })
            .map(|c| c.message.clone())
    };
    Some(Generated {
        name: op.name_any(),
        kind,
        held: true_condition(crate::exclusion::CONDITION, None),
        policy_hold: true_condition("Blocked", Some(crate::operation_gate::REASON_DENIED)),
        phase: status.phase,
        progress: status.progress,
        not_done: status.counts.skipped + status.counts.invalid,
        version: op
            .spec
            .upgrade
            .as_ref()
            .map(|u| u.kubernetes_version.clone()),
        reboot_node: op
            .spec
            .reboot
            .as_ref()
            .and_then(|r| r.nodes.first().cloned()),
        reason: op
            .annotations()
            .get(labels::annotations::LIFECYCLE_REASON)
            .cloned()
            .unwrap_or_default(),
    })
}

/// Puts the Operation `g` first in the status's history (once), keeping the newest
/// [`MAX_HISTORY`].
fn record(history: &mut Vec<GeneratedOperation>, g: &decide::Generate, now: Timestamp) {
    if history.iter().any(|h| h.name == g.name) {
        return;
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, control_plane: bool, kubelet: &str, ready: &str) -> Node {
        let mut labels = serde_json::Map::new();
        if control_plane {
            labels.insert(CONTROL_PLANE_LABEL.into(), json!(""));
        }
        serde_json::from_value(json!({
            "metadata": { "name": name, "labels": labels },
            "status": {
                "nodeInfo": {
                    "kubeletVersion": kubelet, "architecture": "amd64", "bootID": "", "containerRuntimeVersion": "",
                    "kernelVersion": "", "kubeProxyVersion": "", "machineID": "", "operatingSystem": "linux",
                    "osImage": "", "systemUUID": ""
                },
                "conditions": [{ "type": "Ready", "status": ready }],
            },
        }))
        .unwrap()
    }

    #[test]
    fn only_node_changes_the_decision_reads_trigger_a_reconcile() {
        use watcher::Event;
        let mut seen = NodeChanges::default();
        // The initial list: the nodes are recorded, the end of the list triggers.
        assert!(!seen.changed(&Event::Init));
        assert!(seen.changed(&Event::InitApply(node("cp-1", true, "v1.34.4", "True"))));
        assert!(seen.changed(&Event::InitApply(node("w-1", false, "v1.34.4", "True"))));
        assert!(seen.changed(&Event::InitDone));
        // A heartbeat or a condition change: nothing the decision reads.
        assert!(!seen.changed(&Event::Apply(node("w-1", false, "v1.34.4", "False"))));
        assert!(!seen.changed(&Event::Apply(node("cp-1", true, "v1.34.4", "True"))));
        // A new kubelet version, a role change, a new node, a removed node: a change.
        assert!(seen.changed(&Event::Apply(node("w-1", false, "v1.35.0", "False"))));
        assert!(seen.changed(&Event::Apply(node("w-1", true, "v1.35.0", "False"))));
        assert!(seen.changed(&Event::Apply(node("w-2", false, "v1.35.0", "True"))));
        assert!(seen.changed(&Event::Delete(node("w-2", false, "v1.35.0", "True"))));
        // A relist of the same nodes: only its end triggers.
        assert!(!seen.changed(&Event::InitApply(node("cp-1", true, "v1.34.4", "True"))));
        assert!(seen.changed(&Event::InitDone));
    }

    #[test]
    fn nodes_are_observed_with_their_own_report_by_node_name() {
        let report = |node: &str, kubectl: &str| -> Arc<NodeReport> {
            Arc::new(
                serde_json::from_value(json!({
                    "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeReport",
                    "metadata": { "name": node },
                    "spec": { "nodeName": node, "facts": {
                        "collectedAt": "2026-12-01T00:00:00Z",
                        "certificates": [
                            { "name": "apiserver", "notAfter": "2027-12-01T00:00:00Z" },
                            // Forged (written past the schema, or before it refused these):
                            // skipped, not the earliest certificate.
                            { "name": "../../etc/shadow", "notAfter": "2027-01-01T00:00:00Z" },
                            { "name": "admin.conf", "notAfter": "0001-01-01T00:00:00Z" },
                        ],
                        "packages": [{ "name": "kubectl", "version": kubectl }],
                    }},
                }))
                .unwrap(),
            )
        };
        let nodes = [
            Arc::new(node("w-1", false, "v1.34.4", "True")),
            Arc::new(node("cp-1", true, "v1.34.3", "True")),
        ];
        let reports = [report("w-1", "1.34.1-1.1"), report("gone", "1.34.4-1.1")];
        let seen = observe(&nodes, &reports);
        assert_eq!(
            seen.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
            ["cp-1", "w-1"],
            "by name, whatever the caches' order"
        );
        assert!(seen[0].control_plane);
        assert_eq!(seen[0].kubelet_version.as_deref(), Some("v1.34.3"));
        assert_eq!(seen[0].certificates, None, "no report: no certificates");
        assert!(seen[0].packages.is_empty());
        assert_eq!(
            seen[1]
                .certificates
                .iter()
                .flatten()
                .map(|c| c.name.as_str())
                .collect::<Vec<_>>(),
            ["apiserver"],
            "only what an agent could have reported"
        );
        assert_eq!(seen[1].packages[0].version, "1.34.1-1.1");
    }

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

    #[test]
    fn the_certificate_validity_is_read_as_a_go_duration() {
        let config = |v: &str| {
            format!(
                "apiVersion: kubeadm.k8s.io/v1beta4\ncaCertificateValidityPeriod: 87600h0m0s\ncertificateValidityPeriod: {v}\nkind: ClusterConfiguration\n"
            )
        };
        let hours = |h: i64| Some(k8s_openapi::jiff::SignedDuration::from_hours(h));
        assert_eq!(certificate_validity_of(&config("8760h0m0s")), hours(8760));
        assert_eq!(certificate_validity_of(&config("240h")), hours(240));
        assert_eq!(
            certificate_validity_of(&config("\"1h30m\"")),
            Some(k8s_openapi::jiff::SignedDuration::from_secs(5_400))
        );
        // What does not read exactly is left to kubeadm's default, never guessed.
        assert_eq!(certificate_validity_of(&config("1.5h")), None);
        assert_eq!(certificate_validity_of(&config("500ms")), None);
        assert_eq!(certificate_validity_of(&config("0s")), None);
        assert_eq!(certificate_validity_of(&config("8760")), None);
        // The CA's own period is another key.
        assert_eq!(
            certificate_validity_of("caCertificateValidityPeriod: 87600h0m0s\n"),
            None
        );
    }

    fn lifecycle_object(uid: &str, created: &str) -> ClusterLifecycle {
        serde_json::from_value(json!({
            "apiVersion": "bosun.dev/v1alpha1", "kind": "ClusterLifecycle",
            "metadata": { "name": "cluster", "uid": uid, "creationTimestamp": created },
            "spec": { "kubernetesVersion": "v1.34.4" },
        }))
        .unwrap()
    }

    fn operation_labelled(labels: serde_json::Value, created: &str) -> Operation {
        serde_json::from_value(json!({
            "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation",
            "metadata": { "name": "lifecycle-renew-r7", "labels": labels, "creationTimestamp": created },
            "spec": { "renewCertificates": {} },
        }))
        .unwrap()
    }

    /// A generated Operation is recognised by its ClusterLifecycle's uid, never by its name:
    /// a squatter under the generated name, and an Operation of an earlier ClusterLifecycle
    /// of the same name, are not its own (issue 33).
    #[test]
    fn an_operation_is_the_lifecycles_own_by_its_uid_not_its_name() {
        let lc = lifecycle_object("uid-new", "2026-12-03T10:00:00Z");
        let own = operation_labelled(
            json!({ labels::LIFECYCLE: "renewCertificates", labels::LIFECYCLE_UID: "uid-new" }),
            "2026-12-03T11:00:00Z",
        );
        assert!(is_own(&own, &lc));
        let earlier = operation_labelled(
            json!({ labels::LIFECYCLE: "renewCertificates", labels::LIFECYCLE_UID: "uid-old" }),
            "2026-12-03T11:00:00Z",
        );
        assert!(
            !is_own(&earlier, &lc),
            "generated by an earlier ClusterLifecycle"
        );
        let squatter = operation_labelled(json!({}), "2026-12-03T11:00:00Z");
        assert!(
            !is_own(&squatter, &lc),
            "made by hand under the generated name"
        );
        let forged_uid_only = operation_labelled(
            json!({ labels::LIFECYCLE_UID: "uid-new" }),
            "2026-12-03T11:00:00Z",
        );
        assert!(!is_own(&forged_uid_only, &lc), "no lifecycle label");
        // An Operation of an earlier Bosun (lifecycle label, no uid): its own when created
        // after this ClusterLifecycle, not when created before it.
        let old_after = operation_labelled(
            json!({ labels::LIFECYCLE: "renewCertificates" }),
            "2026-12-03T11:00:00Z",
        );
        assert!(is_own(&old_after, &lc));
        let old_before = operation_labelled(
            json!({ labels::LIFECYCLE: "renewCertificates" }),
            "2026-12-03T09:00:00Z",
        );
        assert!(!is_own(&old_before, &lc));
    }

    #[test]
    fn a_taken_name_says_whose_it_is_and_what_to_do() {
        let by_hand = name_taken(
            &operation_labelled(json!({}), "2026-12-03T11:00:00Z"),
            "lifecycle-renew-r7",
        );
        assert!(
            by_hand.contains("was not generated by a ClusterLifecycle"),
            "{by_hand}"
        );
        assert!(
            by_hand.contains("kubectl delete operation lifecycle-renew-r7"),
            "{by_hand}"
        );
        let earlier = name_taken(
            &operation_labelled(
                json!({ labels::LIFECYCLE: "upgrade", labels::LIFECYCLE_UID: "x" }),
                "2026-12-03T11:00:00Z",
            ),
            "lifecycle-upgrade-v1-35-0",
        );
        assert!(earlier.contains("earlier ClusterLifecycle"), "{earlier}");
    }
}
