//! End to end: a `renewCertificates` Operation over the lab's control-plane nodes, run by
//! the real controller and agents (bosun-e2e's `Operator`) with the signed `certs` plugin
//! published with the grants of deploy/examples/plugins/certs.yaml. The agents run
//! `kubeadm certs renew` chrooted into each control-plane node's host root and restart its
//! static pods by moving the manifests; the test reads the certificates on disk before and
//! after and compares them with what the NodeTask's step outputs report.
//!
//! The lab's running API server uses the lab's own PKI (state/pki), not the node roots',
//! so renewing a node root's certificates does not disturb the lab.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result, ensure};
use bosun_api::node_task::{NodeTaskPhase, StepPhase};
use bosun_e2e::Operator;
use bosun_plugins_tests::{example_grants, install_programs, plugins};
use serde_json::json;
use x509_parser::prelude::*;

fn not_after(root: &Path, file: &str) -> i64 {
    let bytes = std::fs::read(root.join(file)).unwrap();
    let (_, pem) = parse_x509_pem(&bytes).unwrap();
    pem.parse_x509().unwrap().validity().not_after.timestamp()
}

const LEAVES: [(&str, &str); 4] = [
    ("apiserver", "etc/kubernetes/pki/apiserver.crt"),
    ("etcd-server", "etc/kubernetes/pki/etcd/server.crt"),
    (
        "front-proxy-client",
        "etc/kubernetes/pki/front-proxy-client.crt",
    ),
    (
        "apiserver-kubelet-client",
        "etc/kubernetes/pki/apiserver-kubelet-client.crt",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_certificates_operation_renews_every_control_plane_node() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    bosun_e2e::apply_crds(&lab.client).await?;
    let cps: Vec<_> = lab
        .nodes
        .iter()
        .filter(|n| n.role == bosun_lab::Role::ControlPlane)
        .cloned()
        .collect();
    ensure!(!cps.is_empty(), "the lab has no control-plane node");
    let mut before: BTreeMap<String, BTreeMap<&str, i64>> = BTreeMap::new();
    for cp in &cps {
        // The free-space preflight runs df chrooted into the node root.
        install_programs(&cp.host_root, &["/usr/bin/df"]);
        before.insert(
            cp.name.clone(),
            LEAVES
                .iter()
                .map(|(n, f)| (*n, not_after(&cp.host_root, f)))
                .collect(),
        );
    }
    let grants = serde_json::to_value(example_grants("certs.yaml"))?;
    bosun_e2e::publish_plugin(
        &lab.client,
        "certs",
        env!("CARGO_PKG_VERSION"),
        plugins().certs.clone(),
        grants,
    )
    .await?;

    let mut operator = Operator::start(&lab, "renew-certs")?;
    let name = operator
        .create_operation(
            "renew",
            json!({ "renewCertificates": { "certificates": ["all"] } }),
        )
        .await?;
    operator.wait_succeeded(&name).await?;

    // What a user sees: `kubectl-bosun status` shows each certificate's old and new expiry
    // under the renew step (the real CLI binary, against the lab).
    let cli = bosun_e2e::binary("kubectl-bosun")?;
    let out = std::process::Command::new(&cli)
        .args(["status", &name, "--kubeconfig"])
        .arg(&lab.kubeconfig)
        .output()?;
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(
        out.status.success(),
        "kubectl-bosun status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{shown}");

    let tasks = operator.tasks(&name).await?;
    assert_eq!(
        tasks.len(),
        cps.len(),
        "one NodeTask per control-plane node: {:?}",
        tasks.keys()
    );
    for cp in &cps {
        let ts = tasks[&cp.name].status.clone().unwrap_or_default();
        assert_eq!(
            ts.phase,
            NodeTaskPhase::Succeeded,
            "{}: {:?}",
            cp.name,
            ts.message
        );
        let steps: Vec<&str> = ts.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            steps,
            [
                "renew-certificates",
                "restart-control-plane",
                "wait-api-server"
            ],
            "{}",
            cp.name
        );
        assert!(
            ts.steps.iter().all(|s| s.phase == StepPhase::Succeeded),
            "{}: {:?}",
            cp.name,
            ts.steps
        );
        let renew = &ts.steps[0];
        for (cert, file) in LEAVES {
            let old = before[&cp.name][cert];
            let new = not_after(&cp.host_root, file);
            assert!(
                new > old,
                "{} {cert}: NotAfter {new} not later than {old}",
                cp.name
            );
            let reported = renew
                .outputs
                .get(&format!("{cert}.after"))
                .with_context(|| format!("{}: no {cert}.after in {:?}", cp.name, renew.outputs))?;
            let reported_before = renew
                .outputs
                .get(&format!("{cert}.before"))
                .context("no .before output")?;
            println!("{} {cert}: {reported_before} -> {reported}", cp.name);
            assert_ne!(reported, reported_before);
            let line = format!("{cert}: {reported_before} → {reported}");
            ensure!(
                shown.contains(&line),
                "status does not show {line:?}:\n{shown}"
            );
        }
        assert_eq!(
            ts.steps[1].outputs.get("restarted").map(String::as_str),
            Some("etcd,kube-apiserver,kube-controller-manager,kube-scheduler")
        );
        // Every manifest is back in place.
        for m in [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
        ] {
            assert!(
                cp.host_root
                    .join(format!("etc/kubernetes/manifests/{m}.yaml"))
                    .exists(),
                "{}: {m}.yaml",
                cp.name
            );
        }
    }
    Ok(())
}
