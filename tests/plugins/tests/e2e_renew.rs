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

/// The lab's control-plane nodes (at least one).
fn control_planes(lab: &bosun_lab::LabHandle) -> Result<Vec<bosun_lab::LabNode>> {
    let cps: Vec<_> = lab
        .nodes
        .iter()
        .filter(|n| n.role == bosun_lab::Role::ControlPlane)
        .cloned()
        .collect();
    ensure!(!cps.is_empty(), "the lab has no control-plane node");
    Ok(cps)
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
    let cps = control_planes(&lab)?;
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

/// Reissues `name` (a leaf kubeadm renews) in `cp`'s host root with the real kubeadm and
/// a validity of `hours`, through kubeadm v1beta4's `certificateValidityPeriod`. kubeadm
/// keeps the certificate's subject and SANs and signs it with the node's CA.
fn reissue_short_lived(
    lab: &bosun_lab::LabHandle,
    cp: &bosun_lab::LabNode,
    name: &str,
    hours: u32,
) -> Result<()> {
    let config = format!(
        "apiVersion: kubeadm.k8s.io/v1beta4\nkind: InitConfiguration\nlocalAPIEndpoint:\n  advertiseAddress: \"10.0.0.1\"\nnodeRegistration:\n  name: \"{}\"\n  criSocket: \"unix:///var/run/containerd/containerd.sock\"\n---\napiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\nkubernetesVersion: \"{}\"\ncertificatesDir: /etc/kubernetes/pki\ncertificateValidityPeriod: {hours}h0m0s\n",
        cp.name,
        bosun_e2e::lifecycle::lab_version(lab)
    );
    let inside = "tmp/bosun-short-validity.yaml";
    std::fs::create_dir_all(cp.host_root.join("tmp"))?;
    std::fs::write(cp.host_root.join(inside), config)?;
    let out = lab
        .kubeadm_in_root(
            cp,
            &["certs", "renew", name, "--config", &format!("/{inside}")],
        )
        .output()
        .context("running kubeadm certs renew")?;
    std::fs::remove_file(cp.host_root.join(inside))?;
    ensure!(
        out.status.success(),
        "kubeadm certs renew {name} with a {hours}h validity on {}: {}{}",
        cp.name,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Reissues a control plane's `apiserver` certificate for kubeadm's default year when the
/// test that shortened it ends by a failure (a panic or an early `?` both drop this).
struct RestoreOnFailure<'a>(&'a bosun_lab::LabHandle, &'a bosun_lab::LabNode);

impl Drop for RestoreOnFailure<'_> {
    fn drop(&mut self) {
        let (lab, cp) = (self.0, self.1);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        if not_after(&cp.host_root, "etc/kubernetes/pki/apiserver.crt") < now + 300 * 86_400
            && let Err(e) = reissue_short_lived(lab, cp, "apiserver", 8760)
        {
            eprintln!(
                "could not restore {}'s apiserver certificate: {e:#}",
                cp.name
            );
        }
    }
}

/// The declarative layer's renewal, run for real (docs/lifecycle.md): a control plane's
/// `apiserver` certificate is reissued by kubeadm to live 10 days; the ClusterLifecycle the
/// controller adopts reports it as the earliest expiry; `autoRenew` with `renewBefore: 30d`
/// generates one renewCertificates Operation, which the agents run with the signed `certs`
/// plugin (kubeadm renews every leaf for kubeadm's default year and the static Pods are
/// restarted); the agents' NodeReports then carry the new expiry (the agents read facts
/// hourly here, so it is the finished task that makes them look), the ClusterLifecycle is
/// InSync with an earliest expiry about a year away, and nothing more is generated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_renew_generates_a_renewal_that_runs_and_the_lifecycle_is_in_sync_again() -> Result<()>
{
    use bosun_api::lifecycle::ClusterLifecycle;
    use bosun_api::operation::{Operation, OperationPhase};
    use bosun_e2e::lifecycle::{self, condition, current, wait_lifecycle};
    use bosun_e2e::operator::phase_of;
    use kube::api::{Api, ListParams, Patch, PatchParams};

    const DAY: i64 = 86_400;
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    lifecycle::reset(&lab).await?;
    let cps = control_planes(&lab)?;
    let short = &cps[0];
    reissue_short_lived(&lab, short, "apiserver", 240)?;
    // Should this test fail before the renewal, the lab keeps a certificate due within
    // 10 days, and every later lifecycle test on this lab would see it as due: reissue it
    // for kubeadm's default year on the way out (a no-op after a successful renewal).
    let _restore = RestoreOnFailure(&lab, short);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    let short_expiry = not_after(&short.host_root, "etc/kubernetes/pki/apiserver.crt");
    ensure!(
        short_expiry < now + 11 * DAY,
        "kubeadm did not reissue {}'s apiserver certificate for 10 days (NotAfter {short_expiry}, now {now})",
        short.name
    );
    for cp in &cps {
        install_programs(&cp.host_root, &["/usr/bin/df"]);
    }
    bosun_e2e::publish_plugin(
        &lab.client,
        "certs",
        env!("CARGO_PKG_VERSION"),
        plugins().certs.clone(),
        serde_json::to_value(example_grants("certs.yaml"))?,
    )
    .await?;

    // The agents' own period is an hour: the renewed expiry can reach the NodeReports only
    // because a finished task makes the agent look at once.
    let mut op = lifecycle::start_with_report_period(&lab, "lifecycle-renew", 3600)?;
    // Adopted with autoRenew off: the short-lived certificate is seen, nothing generated.
    let adopted = wait_lifecycle(
        &mut op,
        "adopted with the short-lived certificate as the earliest",
        |c| {
            current(c)
                && c.status.as_ref().is_some_and(|s| {
                    s.certificates.nodes_reported as usize == cps.len()
                        && s.certificates.earliest.as_deref()
                            == Some(&format!("{}/apiserver", short.name))
                })
        },
    )
    .await?;
    ensure!(
        !adopted.spec.certificates.auto_renew,
        "adoption turned autoRenew on"
    );
    let ops: Api<Operation> = Api::all(op.client.clone());
    let selector = format!("bosun.dev/instance={},bosun.dev/lifecycle", op.instance);
    ensure!(
        ops.list(&ListParams::default().labels(&selector))
            .await?
            .items
            .is_empty(),
        "adoption generated an Operation"
    );

    let api: Api<ClusterLifecycle> = Api::all(op.client.clone());
    api.patch(
        "cluster",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": {
            "certificates": { "autoRenew": true, "renewBefore": "30d" },
            "operationDefaults": { "executionMode": "Auto" },
        }})),
    )
    .await
    .context("turning autoRenew on")?;

    // One renewal is generated; it runs to Succeeded.
    let renewal = bosun_e2e::lifecycle::wait_one_generated(&mut op, "renewal").await?;
    let name = renewal
        .metadata
        .name
        .clone()
        .context("a generated Operation without a name")?;
    ensure!(
        renewal.spec.renew_certificates.is_some(),
        "{name} is not a renewCertificates Operation: {:?}",
        renewal.spec
    );
    let done = op.wait_succeeded(&name).await?;
    ensure!(phase_of(&done) == OperationPhase::Succeeded);

    // Renewed on disk for kubeadm's default year.
    let renewed = not_after(&short.host_root, "etc/kubernetes/pki/apiserver.crt");
    ensure!(
        renewed > now + 300 * DAY,
        "{}'s apiserver certificate expires at {renewed}, not about a year from now",
        short.name
    );

    // The reports carry the new expiry; the lifecycle is in sync and records the renewal.
    let synced = wait_lifecycle(&mut op, "InSync with the renewed certificates", |c| {
        current(c)
            && condition(c, "InSync").as_deref() == Some("True")
            && c.status.as_ref().is_some_and(|s| {
                s.certificates
                    .earliest_expiry
                    .as_ref()
                    .is_some_and(|t| t.0.as_second() > now + 300 * DAY)
            })
    })
    .await?;
    let status = synced.status.clone().unwrap_or_default();
    ensure!(
        status
            .history
            .iter()
            .any(|h| h.name == name && h.kind == "renewCertificates"),
        "the history does not list {name}: {:?}",
        status.history
    );
    println!(
        "renewal {name} Succeeded; earliest expiry {:?} ({:?}), next renewal {:?}; summary: {:?}",
        status.certificates.earliest_expiry,
        status.certificates.earliest,
        status.certificates.next_renewal,
        status.summary
    );
    // Nothing more is generated: the renewed certificates are outside renewBefore.
    let later = ops
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;
    ensure!(
        later.len() == 1,
        "after the renewal: {:?}",
        later
            .iter()
            .map(|o| o.metadata.name.clone())
            .collect::<Vec<_>>()
    );

    lifecycle::remove(&lab).await?;
    op.finish().await
}
