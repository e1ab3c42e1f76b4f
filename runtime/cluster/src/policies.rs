//! The cluster's Policy objects as a compiled set, shared by the controller (the operation
//! decision point) and the agent (the capabilities and step decision points).
//!
//! [`PolicyWatch`] keeps every `Policy` resource (optionally only those matching a label
//! selector) in a reflector, compiled into a [`PolicySet`] once per generation of the set
//! (the set digest is the key: any policy created, changed or deleted makes a new one), with
//! a pool of evaluators so each concurrent caller has its own engine.
//!
//! Fail closed: until the Policy list has been read once, no decision is made (callers get
//! [`Error::NotSynced`] and try again later); a Policy that does not compile denies every
//! decision (see `bosun_policy`).
//!
//! **A watch that is open but silent.** The watch can stay connected to an API server that
//! no longer delivers (one whose stacked etcd member stopped keeps its watches open and sends
//! nothing until their timeout, 290 s for the agents). A Policy created, changed or deleted
//! meanwhile would then not reach the decisions made here. [`PolicyWatch::current`] closes
//! that gap where it matters: before it hands out the set, it lists the Policies' metadata
//! with a quorum read and compares; a store that is behind has its watch opened again on a
//! new connection, and no decision is made until the store has caught up
//! ([`Error::PoliciesBehind`]). The lab's real-node stage met this: a deleted freeze Policy
//! still denied a step retried 300 s later, on an agent whose Policy watch had reached the
//! API server of the control plane whose etcd member the test had stopped.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bosun_api::policy::{Enforcement as ApiEnforcement, Policy};
use bosun_policy::{Enforcement, Evaluator, Limits, PolicySet, PolicySource};
use bosun_telemetry::Watched;
use futures::StreamExt;
use kube::api::{Api, ListParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

use crate::watch::{Liveness, behind, listed_versions, stored_versions};
use crate::{Error, Result};

/// The log target of the Policy watch's own lines ("policy set compiled", watch errors):
/// the agent runs this watch too, and its log should not name the controller's module.
pub const POLICY_LOG_TARGET: &str = "bosun::policies";

/// The cluster's policies, watched and compiled. Share it (`Arc`) between workers.
pub struct PolicyWatch {
    store: Store<Policy>,
    writer: Mutex<Option<reflector::store::Writer<Policy>>>,
    limits: Limits,
    current: Mutex<Option<Arc<Generation>>>,
    /// Opens the watch again when [`PolicyWatch::current`] finds it behind.
    liveness: Liveness,
    /// What the watch lists (set when it starts), for [`PolicyWatch::current`]'s quorum read.
    listed: Mutex<Option<(Api<Policy>, ListParams)>>,
}

impl std::fmt::Debug for PolicyWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyWatch").finish_non_exhaustive()
    }
}

/// One compiled generation of the policy set, with its evaluators.
pub struct Generation {
    set: PolicySet,
    /// Evaluators not in use. Each caller takes one (or clones a new one from the set) and
    /// puts it back, so concurrent decisions never share an engine and the engines are
    /// cloned once per worker, not per decision.
    idle: Mutex<Vec<Evaluator>>,
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("digest", &self.set.digest())
            .finish_non_exhaustive()
    }
}

impl Generation {
    /// Compiles `sources` (never fails: broken policies are kept and deny).
    pub fn compile(sources: &[PolicySource], limits: Limits) -> Generation {
        Generation {
            set: PolicySet::compile(sources, limits),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The compiled set.
    pub fn set(&self) -> &PolicySet {
        &self.set
    }

    /// `sha256:<hex>` of the set; every decision it makes carries it.
    pub fn digest(&self) -> &str {
        self.set.digest()
    }

    /// Runs `f` with an evaluator no one else is using.
    pub fn with_evaluator<R>(&self, f: impl FnOnce(&mut Evaluator) -> R) -> R {
        let taken = self.idle.lock().ok().and_then(|mut v| v.pop());
        let mut evaluator = taken.unwrap_or_else(|| self.set.evaluator());
        let out = f(&mut evaluator);
        if let Ok(mut v) = self.idle.lock() {
            v.push(evaluator);
        }
        out
    }
}

/// A `Policy` resource as the policy engine sees it.
pub fn source_of(policy: &Policy) -> PolicySource {
    PolicySource {
        name: policy.name_any(),
        rego: policy.spec.rego.clone(),
        data: policy.spec.data.clone(),
        enforcement: match policy.spec.enforcement {
            ApiEnforcement::Deny => Enforcement::Deny,
            ApiEnforcement::Warn => Enforcement::Warn,
            ApiEnforcement::Audit => Enforcement::Audit,
        },
    }
}

impl Default for PolicyWatch {
    fn default() -> Self {
        PolicyWatch::new()
    }
}

impl PolicyWatch {
    /// A watch that sees nothing until [`PolicyWatch::drive`]'s future (or
    /// [`PolicyWatch::changes`]' stream) runs; until then every gate waits.
    pub fn new() -> PolicyWatch {
        let (store, writer) = reflector::store();
        PolicyWatch {
            store,
            writer: Mutex::new(Some(writer)),
            limits: Limits::default(),
            current: Mutex::new(None),
            liveness: Liveness::new(Watched::Policies),
            listed: Mutex::new(None),
        }
    }

    /// The future that keeps the watch current (run it on the runtime). The first call of
    /// this or [`PolicyWatch::changes`] gets it; later calls get `None`.
    pub fn drive(
        &self,
        client: Client,
        selector: Option<String>,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        Some(
            self.changes(client, watcher::Config::default(), selector)?
                .for_each(|()| async {}),
        )
    }

    /// Keeps the watch current while polled, yielding once per change to the set of
    /// policies (for triggering reconciles). The first call of this or
    /// [`PolicyWatch::drive`] gets it; later calls get `None`.
    /// Watches every Policy, or those matching `selector` (a label selector), with `config`
    /// (the agent's default, or the controller's shorter watches:
    /// `watch::controller_config`).
    pub fn changes(
        &self,
        client: Client,
        config: watcher::Config,
        selector: Option<String>,
    ) -> Option<impl futures::Stream<Item = ()> + Send + 'static> {
        let writer = self.writer.lock().ok()?.take()?;
        let mut config = config;
        if let Some(s) = &selector {
            config = config.labels(s);
        }
        let api: Api<Policy> = Api::all(client);
        let params = ListParams {
            label_selector: config.label_selector.clone(),
            field_selector: config.field_selector.clone(),
            ..ListParams::default()
        };
        *self
            .listed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((api.clone(), params));
        let events = crate::watch::reopenable(api, config, self.liveness.clone());
        Some(
            reflector::reflector(writer, events)
                .backoff(crate::watch::WatchBackoff::new(crate::watch::seed_of(
                    "bosun.dev/policies",
                )))
                .filter_map(|event| async move {
                    match event {
                        Ok(
                            watcher::Event::Apply(_)
                            | watcher::Event::Delete(_)
                            | watcher::Event::InitDone,
                        ) => Some(()),
                        Ok(_) => None,
                        Err(e) => {
                            tracing::warn!(target: POLICY_LOG_TARGET, error = %e, "watching Policy objects failed; retrying");
                            None
                        }
                    }
                }),
        )
    }

    /// The reflector's store of Policy objects.
    pub fn store(&self) -> Store<Policy> {
        self.store.clone()
    }

    /// The compiled set for the policies held now, compiling only when they changed since
    /// the last call. Waits up to `wait` for the first list.
    pub async fn generation(&self, wait: Duration) -> Result<Arc<Generation>> {
        self.synced(wait).await?;
        Ok(self.compiled())
    }

    /// [`PolicyWatch::generation`], once the store is known to hold every Policy the API
    /// server holds now: a quorum read of the Policies' metadata (one small list) is compared
    /// with the store, and a store that is behind has its watch opened again and is waited
    /// on for up to [`CATCH_UP`] (see the module documentation). For the decisions made
    /// right before something runs (the agents' step gates). Without a started watch
    /// (tests that fill the store otherwise), this is [`PolicyWatch::generation`].
    pub async fn current(&self, wait: Duration) -> Result<Arc<Generation>> {
        self.synced(wait).await?;
        let listed = self
            .listed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if let Some((api, params)) = listed {
            let list = api.list_metadata(&params).await.map_err(Error::kube(
                "listing the Policy objects (to check that this process's Policy watch is current)",
            ))?;
            let (on_server, list_version) = listed_versions(&list);
            let mut missing = behind(&on_server, &list_version, &stored_versions(&self.store));
            if !missing.is_empty() {
                tracing::warn!(target: POLICY_LOG_TARGET, behind = ?missing, silent_for = ?self.liveness.silent_for(), "the Policy watch does not show the Policy objects as the API server lists them; watching again on a new connection");
                self.liveness.reopen();
                let started = tokio::time::Instant::now();
                while !missing.is_empty() {
                    if started.elapsed() >= CATCH_UP {
                        return Err(Error::PoliciesBehind {
                            objects: missing,
                            waited: CATCH_UP,
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    missing = behind(&on_server, &list_version, &stored_versions(&self.store));
                }
            }
        }
        Ok(self.compiled())
    }

    /// Waits up to `wait` for the first list.
    async fn synced(&self, wait: Duration) -> Result<()> {
        if tokio::time::timeout(wait, self.store.wait_until_ready())
            .await
            .map(|r| r.is_ok())
            != Ok(true)
        {
            return Err(Error::NotSynced { waited: wait });
        }
        Ok(())
    }

    /// The compiled set for the policies held now (compiled again only when they changed).
    fn compiled(&self) -> Arc<Generation> {
        let mut policies = self.store.state();
        policies.sort_by_key(|p| p.name_any());
        let sources: Vec<PolicySource> = policies.iter().map(|p| source_of(p)).collect();
        let digest = bosun_policy::set_digest(&sources);
        let mut current = self
            .current
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(g) = current.as_ref()
            && g.digest() == digest
        {
            return g.clone();
        }
        let started = std::time::Instant::now();
        let g = Arc::new(Generation::compile(&sources, self.limits));
        tracing::info!(target: POLICY_LOG_TARGET, digest = %g.digest(), policies = sources.len(), healthy = g.set().is_healthy(), elapsed = ?started.elapsed(), "policy set compiled");
        *current = Some(g.clone());
        g
    }
}

/// How long [`PolicyWatch::current`] waits for a watch it opened again to bring what the API
/// server lists: a new list and watch, on a working API server, takes milliseconds.
pub const CATCH_UP: Duration = Duration::from_secs(5);

/// How long a gate waits for the first Policy list before giving up for this reconcile.
pub const SYNC_WAIT: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use bosun_api::policy::PolicySpec;
    use serde_json::json;

    use super::*;

    fn policy(name: &str, rego: &str) -> Policy {
        Policy::new(
            name,
            PolicySpec {
                rego: rego.into(),
                data: None,
                enforcement: ApiEnforcement::Deny,
            },
        )
    }

    #[test]
    fn evaluators_are_reused_and_decisions_carry_the_set_digest() {
        let g = Generation::compile(
            &[source_of(&policy(
                "freeze",
                "package bosun.operation\n\ndeny contains \"frozen\" if input.cluster.annotations[\"bosun.dev/change-freeze\"] == \"true\"\n",
            ))],
            Limits::default(),
        );
        let input = |freeze: &str| json!({"operation": {"name": "o", "kind": "Custom"}, "cluster": {"annotations": {"bosun.dev/change-freeze": freeze}}, "now": "2026-11-30T00:00:00Z"});
        let d = g
            .with_evaluator(|e| e.evaluate(bosun_policy::DecisionPoint::Operation, &input("true")));
        assert!(!d.allowed);
        assert_eq!(d.deny_messages(), vec!["freeze: frozen".to_string()]);
        assert_eq!(d.policy_set_digest, g.digest());
        let d = g.with_evaluator(|e| {
            e.evaluate(bosun_policy::DecisionPoint::Operation, &input("false"))
        });
        assert!(d.allowed);
        assert_eq!(
            g.idle.lock().unwrap().len(),
            1,
            "the evaluator went back to the pool and was reused"
        );
    }

    /// A fake API server whose Policy watches stay open and silent (as one whose etcd member
    /// stopped does) and whose lists hold a `freeze` Policy once `created` is set; its full
    /// lists do so only when `lists_deliver` is set too (a server that still serves the old
    /// state to the watch's list).
    fn silent_server(created: Arc<std::sync::atomic::AtomicBool>, lists_deliver: bool) -> Client {
        use std::sync::atomic::Ordering;
        let service = tower::service_fn(move |req: http::Request<kube::client::Body>| {
            let created = created.clone();
            async move {
                if crate::client::is_watch(req.uri()) {
                    std::future::pending::<()>().await;
                }
                let metadata_only = req
                    .headers()
                    .get(http::header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.contains("PartialObjectMetadataList"));
                let holds = created.load(Ordering::SeqCst) && (metadata_only || lists_deliver);
                let items = if holds {
                    let mut p = serde_json::to_value(policy(
                        "freeze",
                        "package bosun.operation\n\ndeny contains \"frozen\" if true\n",
                    ))
                    .unwrap();
                    p["metadata"]["resourceVersion"] = json!("7");
                    vec![p]
                } else {
                    vec![]
                };
                let version = if created.load(Ordering::SeqCst) {
                    "7"
                } else {
                    "5"
                };
                let list = json!({"apiVersion": "bosun.dev/v1alpha1", "kind": "PolicyList",
                    "metadata": {"resourceVersion": version}, "items": items});
                Ok::<_, std::convert::Infallible>(
                    http::Response::builder()
                        .status(200)
                        .body(kube::client::Body::from(serde_json::to_vec(&list).unwrap()))
                        .unwrap(),
                )
            }
        });
        Client::new(service, "default")
    }

    fn decide(g: &Generation) -> bool {
        let input =
            json!({"operation": {"name": "o", "kind": "Custom"}, "now": "2026-12-06T00:00:00Z"});
        g.with_evaluator(|e| e.evaluate(bosun_policy::DecisionPoint::Operation, &input))
            .allowed
    }

    #[tokio::test]
    async fn a_policy_a_silent_watch_missed_decides_once_the_watch_is_opened_again() {
        let created = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watch = PolicyWatch::new();
        tokio::spawn(
            watch
                .drive(silent_server(created.clone(), true), None)
                .unwrap(),
        );
        assert!(decide(&watch.current(SYNC_WAIT).await.unwrap()));
        created.store(true, std::sync::atomic::Ordering::SeqCst);
        // The watch is silent: the set as held does not know the new Policy ...
        assert!(decide(&watch.generation(SYNC_WAIT).await.unwrap()));
        // ... and the set a decision before a step gets does.
        let g = watch.current(SYNC_WAIT).await.unwrap();
        assert!(!decide(&g), "the freeze Policy decides");
    }

    #[tokio::test]
    async fn no_set_is_handed_out_while_the_watch_cannot_catch_up() {
        let created = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watch = PolicyWatch::new();
        tokio::spawn(
            watch
                .drive(silent_server(created.clone(), false), None)
                .unwrap(),
        );
        assert!(decide(&watch.current(SYNC_WAIT).await.unwrap()));
        created.store(true, std::sync::atomic::Ordering::SeqCst);
        let e = watch.current(SYNC_WAIT).await.expect_err("behind");
        match &e {
            Error::PoliciesBehind { objects, waited } => {
                assert_eq!(objects, &vec!["freeze".to_string()]);
                assert_eq!(*waited, CATCH_UP);
            }
            other => panic!("not PoliciesBehind: {other}"),
        }
        assert!(e.to_string().contains("does not show freeze"), "{e}");
    }
}
