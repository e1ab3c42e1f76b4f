//! The status of the cluster's Policy objects: whether each compiles, its errors with
//! `policy:line:column`, its digest and the `Compiled` condition. Written by the controller
//! (the agent only reads policies).

use std::sync::Arc;
use std::time::Duration;

use bosun_api::policy::Policy;
use bosun_cluster::policies::source_of;
use bosun_policy::{Limits, PolicySet};
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::time::set_condition;

/// Writes every watched Policy's status: compiled or not, its errors (`policy:line:column:
/// message`), its digest, and the `Compiled` condition. Runs until shutdown.
pub async fn run_status(client: Client, manager: String, selector: Option<String>) {
    let api: Api<Policy> = Api::all(client.clone());
    let mut config = bosun_cluster::watch::controller_config();
    if let Some(s) = &selector {
        config = config.labels(s);
    }
    let ctx = Arc::new((client, manager));
    Controller::new(api, config)
        .shutdown_on_signal()
        .run(
            |policy: Arc<Policy>, ctx: Arc<(Client, String)>| async move {
                write_policy_status(&policy, &ctx.0, &ctx.1).await
            },
            |_policy, _error: &bosun_cluster::Error, _ctx| Action::requeue(Duration::from_secs(5)),
            ctx,
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "policy status reconcile error");
            }
        })
        .await;
}

/// The status Bosun writes for `policy`: what compiling it alone gives (a policy's compile
/// result depends only on itself).
pub fn policy_status(policy: &Policy, now: Timestamp) -> bosun_api::policy::PolicyStatus {
    let source = source_of(policy);
    let set = PolicySet::compile(std::slice::from_ref(&source), Limits::default());
    let status = set.statuses().into_iter().next();
    let errors: Vec<String> = status
        .as_ref()
        .map(|s| s.errors.iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    let compiled = status.as_ref().is_some_and(|s| s.compiled);
    let mut out = policy.status.clone().unwrap_or_default();
    out.compiled = compiled;
    out.errors = errors.clone();
    out.digest = Some(bosun_policy::source_digest(&source));
    out.observed_generation = policy.metadata.generation;
    let (reason, message) = if compiled {
        let at = status.and_then(|s| s.point).map_or_else(String::new, |p| {
            format!("evaluated at the {p} decision point")
        });
        ("Compiled", at)
    } else {
        (
            "CompileFailed",
            format!(
                "{}; a policy that does not compile blocks every decision until it is fixed or deleted",
                errors.join("; ")
            ),
        )
    };
    set_condition(
        &mut out.conditions,
        "Compiled",
        compiled,
        reason,
        &message,
        policy.metadata.generation,
        now,
    );
    out
}

async fn write_policy_status(
    policy: &Policy,
    client: &Client,
    manager: &str,
) -> Result<Action, bosun_cluster::Error> {
    let name = policy.name_any();
    let status = policy_status(policy, Timestamp::now());
    if policy.status.as_ref() == Some(&status) {
        return Ok(Action::await_change());
    }
    if !status.compiled {
        tracing::warn!(policy = %name, errors = ?status.errors, "policy does not compile; it blocks every decision");
    }
    let api: Api<Policy> = Api::all(client.clone());
    let patch = json!({ "apiVersion": "bosun.dev/v1alpha1", "kind": "Policy", "metadata": { "name": name }, "status": status });
    api.patch_status(
        &name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(bosun_cluster::Error::kube(format!(
        "writing the status of Policy {name}"
    )))?;
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bosun_api::policy::{Enforcement as ApiEnforcement, PolicySpec};

    fn policy(name: &str, rego: &str) -> Policy {
        let mut p = Policy::new(
            name,
            PolicySpec {
                rego: rego.into(),
                data: None,
                enforcement: ApiEnforcement::Deny,
            },
        );
        p.metadata.generation = Some(3);
        p
    }

    #[test]
    fn a_policy_that_compiles_has_a_compiled_status_with_its_digest() {
        let p = policy(
            "ok",
            "package bosun.step\n\ndeny contains \"no\" if input.x\n",
        );
        let s = policy_status(&p, Timestamp::UNIX_EPOCH);
        assert!(s.compiled, "{s:?}");
        assert!(s.errors.is_empty());
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(
            s.digest.as_deref(),
            Some(bosun_policy::source_digest(&source_of(&p)).as_str())
        );
        let c = s
            .conditions
            .iter()
            .find(|c| c.type_ == "Compiled")
            .expect("a Compiled condition");
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("True", "Compiled"));
        assert!(c.message.contains("step"), "{}", c.message);
    }

    #[test]
    fn a_broken_policy_reports_line_and_column() {
        let p = policy(
            "broken",
            "package bosun.step\n\ndeny contains msg if {\n  msg := \n}\n",
        );
        let s = policy_status(&p, Timestamp::UNIX_EPOCH);
        assert!(!s.compiled);
        assert_eq!(s.errors.len(), 1, "{:?}", s.errors);
        assert!(
            s.errors[0].starts_with("broken:5:") || s.errors[0].starts_with("broken:4:"),
            "{}",
            s.errors[0]
        );
        let c = s
            .conditions
            .iter()
            .find(|c| c.type_ == "Compiled")
            .expect("a Compiled condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "CompileFailed")
        );
        assert!(c.message.contains("blocks every decision"), "{}", c.message);
    }
}
