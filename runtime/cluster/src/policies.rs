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

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bosun_api::policy::{Enforcement as ApiEnforcement, Policy};
use bosun_policy::{Enforcement, Evaluator, Limits, PolicySet, PolicySource};
use bosun_telemetry::Watched;
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};

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
        let events = watcher(api, config).inspect(crate::watch::count_lists(Watched::Policies));
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
        if tokio::time::timeout(wait, self.store.wait_until_ready())
            .await
            .map(|r| r.is_ok())
            != Ok(true)
        {
            return Err(Error::NotSynced { waited: wait });
        }
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
            return Ok(g.clone());
        }
        let started = std::time::Instant::now();
        let g = Arc::new(Generation::compile(&sources, self.limits));
        tracing::info!(target: POLICY_LOG_TARGET, digest = %g.digest(), policies = sources.len(), healthy = g.set().is_healthy(), elapsed = ?started.elapsed(), "policy set compiled");
        *current = Some(g.clone());
        Ok(g)
    }
}

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
}
