//! The planner and the first-party plugins cannot drift apart: every agent step the planner
//! can build (an `upgrade` with each combination of packages, on first control-plane, other
//! control-plane and worker nodes; a `renewCertificates` with every certificate name, with
//! and without `renewBefore`) names a plugin that exists, an action that plugin declares,
//! and params its declared JSON Schema accepts, checked by the real host the way the agent
//! checks them before running anything. No params are copied by hand: they come from
//! `bosun_planner::plan`.

use std::collections::BTreeMap;

use bosun_api::grants::Grants;
use bosun_api::operation::{OperationSpec, RunsOn};
use bosun_host::{Error, LoadedPlugin};
use bosun_planner::{NodeInfo, OperationIdentity, plan_identified};
use bosun_plugins_tests::{Node, plugins};
use serde_json::json;

/// Every Operation spec whose steps the planner builds itself (custom steps are the user's).
fn planner_specs() -> Vec<OperationSpec> {
    let mut specs = Vec::new();
    let packages = ["kubeadm", "kubelet", "kubectl"];
    for mask in 0..8u32 {
        let chosen: Vec<&str> = packages
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, p)| *p)
            .collect();
        specs.push(
            serde_json::from_value(
                json!({ "upgrade": { "kubernetesVersion": "v1.34.5", "packages": chosen } }),
            )
            .unwrap(),
        );
    }
    let certificates = [
        "all",
        "apiserver",
        "apiserver-kubelet-client",
        "apiserver-etcd-client",
        "front-proxy-client",
        "etcd-server",
        "etcd-peer",
        "etcd-healthcheck-client",
        "admin.conf",
        "super-admin.conf",
        "controller-manager.conf",
        "scheduler.conf",
    ];
    for c in certificates {
        specs.push(
            serde_json::from_value(json!({ "renewCertificates": { "certificates": [c] } }))
                .unwrap(),
        );
        specs.push(
            serde_json::from_value(
                json!({ "renewCertificates": { "certificates": [c], "renewBefore": "720h" } }),
            )
            .unwrap(),
        );
    }
    // Every name at once (`all` with names is refused by the API server's schema).
    specs.push(
        serde_json::from_value(
            json!({ "renewCertificates": { "certificates": certificates[1..] } }),
        )
        .unwrap(),
    );
    specs
}

fn is_schema_refusal(e: &Error) -> bool {
    matches!(e, Error::InvalidParams { .. } | Error::UnknownAction { .. })
}

#[test]
fn every_step_the_planner_builds_matches_the_real_plugins_actions_and_params_schema() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::new(dir.path(), &["control-plane"]);
    let p = plugins();
    let loaded: BTreeMap<&str, LoadedPlugin> = [
        ("certs", &p.certs),
        ("kubeadm-upgrade", &p.kubeadm_upgrade),
        ("packages", &p.packages),
        ("kubelet", &p.kubelet),
        ("etcd", &p.etcd),
    ]
    .into_iter()
    .map(|(name, bytes)| (name, node.load(bytes, name)))
    .collect();
    let cluster = [
        NodeInfo::control_plane("cp-0"),
        NodeInfo::control_plane("cp-1"),
        NodeInfo::worker("w-0"),
    ];

    let mut checked: BTreeMap<(String, String), usize> = BTreeMap::new();
    for spec in planner_specs() {
        // As the controller plans a stored Operation.
        let identity = OperationIdentity {
            uid: "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9".into(),
            created: "2026-12-06T15:04:05Z".into(),
        };
        let out = plan_identified("op", Some(&identity), &spec, &cluster, None)
            .unwrap_or_else(|e| panic!("planning {spec:?}: {e}"));
        for task in &out.tasks {
            for step in task
                .spec
                .steps
                .iter()
                .filter(|s| s.runs_on == RunsOn::Agent)
            {
                let name = step
                    .plugin
                    .as_deref()
                    .unwrap_or_else(|| panic!("agent step {} names no plugin", step.name));
                let plugin = loaded.get(name).unwrap_or_else(|| {
                    panic!(
                        "step {} names plugin {name}, which is not first-party",
                        step.name
                    )
                });
                let declared: Vec<&str> = plugin
                    .metadata()
                    .actions
                    .iter()
                    .map(|a| a.name.as_str())
                    .collect();
                assert!(
                    declared.contains(&step.action.as_str()),
                    "{name} declares {declared:?}, the planner asks for {}",
                    step.action
                );
                let params = step.params.clone().unwrap_or_else(|| json!({}));
                // The host checks action and params against the declared schema before the
                // plugin's code runs; whatever happens after that (no grants here) is not
                // the question.
                match node.host.preflight(
                    plugin,
                    &Grants::default(),
                    &node.ctx,
                    &step.action,
                    &params.to_string(),
                ) {
                    Err(f) => assert!(
                        !is_schema_refusal(&f.error),
                        "{} on {} ({name} {}): the plugin refuses the planner's params {params}: {}",
                        step.name,
                        task.spec.node_name,
                        step.action,
                        f.error
                    ),
                    // Nor does the plugin's own check of its params (what a schema cannot
                    // say: `renew` needs `renewBefore` or `issuedBefore`).
                    Ok(report) => {
                        if let Ok(checks) = &report.result {
                            let refused: Vec<_> = checks
                                .iter()
                                .filter(|c| {
                                    c.name == "params" && c.status == bosun_host::CheckStatus::Fail
                                })
                                .collect();
                            assert!(
                                refused.is_empty(),
                                "{} on {} ({name} {}): the plugin's preflight refuses the planner's params {params}: {refused:?}",
                                step.name,
                                task.spec.node_name,
                                step.action
                            );
                        }
                    }
                }
                // The check is live: the same params with a field the plugin does not
                // declare are refused by it.
                let mut wrong = params.clone();
                wrong["plannerDrift"] = json!(true);
                let f = node
                    .host
                    .preflight(
                        plugin,
                        &Grants::default(),
                        &node.ctx,
                        &step.action,
                        &wrong.to_string(),
                    )
                    .expect_err("params with an undeclared field must be refused");
                assert!(
                    matches!(f.error, Error::InvalidParams { .. }),
                    "{}",
                    f.error
                );
                *checked
                    .entry((name.to_owned(), step.action.clone()))
                    .or_default() += 1;
            }
        }
    }
    // Every plugin action the planner can use was reached.
    let reached: Vec<(&str, &str)> = checked
        .keys()
        .map(|(p, a)| (p.as_str(), a.as_str()))
        .collect();
    assert_eq!(
        reached,
        [
            ("certs", "renew"),
            ("certs", "restart-control-plane"),
            ("etcd", "health"),
            ("etcd", "snapshot"),
            ("kubeadm-upgrade", "apply"),
            ("kubeadm-upgrade", "node"),
            ("kubelet", "restart"),
            ("packages", "install"),
        ]
    );
}
