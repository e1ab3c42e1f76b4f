//! The ClusterLifecycle singleton in the shared lab: bringing the lab to a known state
//! before a test of the declarative layer, and back after it, for every test binary that
//! runs the lifecycle reconciler (tests/e2e's `lifecycle`, tests/plugins' `e2e_renew`).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bosun_api::lifecycle::ClusterLifecycle;
use bosun_api::node_report::NodeReport;
use bosun_lab::LabHandle;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::{DEADLINE, MANAGER, Operator, apply_crds};

const POLL: Duration = Duration::from_millis(250);

/// The lab's version, `vX.Y.Z`.
pub fn lab_version(lab: &LabHandle) -> String {
    let v = lab.kubernetes_version.trim();
    if v.starts_with('v') {
        v.to_string()
    } else {
        format!("v{v}")
    }
}

/// The CRDs, no ClusterLifecycle, and the `kube-system/kubeadm-config` ConfigMap kubeadm
/// writes on `kubeadm init` (the lab's control plane was not made by `kubeadm init`, so it
/// has none), at the lab's version and kubeadm's default certificate validity: what a
/// controller adopts from.
///
/// No NodeReport either: the lab outlives test runs, and a report an earlier run left
/// (with facts that have changed since, such as certificates renewed by another test)
/// would stand in for the one this test's agents are about to write.
pub async fn reset(lab: &LabHandle) -> Result<()> {
    apply_crds(&lab.client).await?;
    delete_lifecycle(&lab.client).await?;
    // Operations a ClusterLifecycle generated in a run that was cut short (its cleanup never
    // ran): their names (`lifecycle-renew-r1`, ...) are the names this run's lifecycle will
    // generate.
    let ops: Api<bosun_api::operation::Operation> = Api::all(lab.client.clone());
    let generated = ListParams::default().labels("bosun.dev/lifecycle");
    if !ops.list(&generated).await?.items.is_empty() {
        ops.delete_collection(&DeleteParams::default(), &generated)
            .await
            .context("deleting the generated Operations earlier runs left")?;
    }
    let started = Instant::now();
    while !ops.list(&generated).await?.items.is_empty() {
        ensure!(
            started.elapsed() < DEADLINE,
            "the generated Operations earlier runs left were not deleted"
        );
        tokio::time::sleep(POLL).await;
    }
    let reports: Api<NodeReport> = Api::all(lab.client.clone());
    reports
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .context("deleting the NodeReports earlier runs left")?;
    let started = Instant::now();
    while !reports.list(&ListParams::default()).await?.items.is_empty() {
        ensure!(
            started.elapsed() < DEADLINE,
            "the NodeReports were not deleted"
        );
        tokio::time::sleep(POLL).await;
    }
    let maps: Api<ConfigMap> = Api::namespaced(lab.client.clone(), "kube-system");
    let config = format!(
        "apiServer: {{}}\napiVersion: kubeadm.k8s.io/v1beta4\ncertificatesDir: /etc/kubernetes/pki\nclusterName: kubernetes\nkind: ClusterConfiguration\nkubernetesVersion: {}\nnetworking:\n  dnsDomain: cluster.local\n  serviceSubnet: 10.96.0.0/12\n",
        lab_version(lab)
    );
    maps.patch(
        "kubeadm-config",
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": { "name": "kubeadm-config", "namespace": "kube-system" },
            "data": { "ClusterConfiguration": config },
        })),
    )
    .await
    .context("creating kube-system/kubeadm-config as kubeadm would")?;
    Ok(())
}

/// Leaves the lab as it was: no ClusterLifecycle, no kubeadm-config (so no other test's
/// default-install controller adopts).
pub async fn remove(lab: &LabHandle) -> Result<()> {
    delete_lifecycle(&lab.client).await?;
    let maps: Api<ConfigMap> = Api::namespaced(lab.client.clone(), "kube-system");
    if maps.get_opt("kubeadm-config").await?.is_some() {
        maps.delete("kubeadm-config", &DeleteParams::default())
            .await?;
    }
    Ok(())
}

/// Deletes the ClusterLifecycle `cluster` and waits until it is gone.
pub async fn delete_lifecycle(client: &Client) -> Result<()> {
    let api: Api<ClusterLifecycle> = Api::all(client.clone());
    if api.get_opt("cluster").await?.is_some() {
        api.delete("cluster", &DeleteParams::default()).await?;
    }
    let started = Instant::now();
    while api.get_opt("cluster").await?.is_some() {
        ensure!(
            started.elapsed() < DEADLINE,
            "ClusterLifecycle cluster was not deleted"
        );
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

/// The controller with the lifecycle reconciler, the agents keeping their NodeReports
/// (read every second).
pub fn start(lab: &LabHandle, test: &str) -> Result<Operator> {
    start_with_report_period(lab, test, 1)
}

/// As [`start`], the controller reaching the API server through `kubeconfig` (a relay's:
/// [`crate::stall::StallingRelay::kubeconfig`]).
pub fn start_through(
    lab: &LabHandle,
    test: &str,
    kubeconfig: &std::path::Path,
) -> Result<Operator> {
    start_lifecycle(lab, test, 1, Some(kubeconfig))
}

/// As [`start`], the agents reading their node's facts every `seconds` (besides on start
/// and when a task of their node finishes).
pub fn start_with_report_period(lab: &LabHandle, test: &str, seconds: u64) -> Result<Operator> {
    start_lifecycle(lab, test, seconds, None)
}

fn start_lifecycle(
    lab: &LabHandle,
    test: &str,
    report_seconds: u64,
    controller_kubeconfig: Option<&std::path::Path>,
) -> Result<Operator> {
    Operator::start_with(
        lab,
        test,
        &["--lifecycle".into(), "true".into()],
        &[
            "--node-report".into(),
            "true".into(),
            "--node-report-seconds".into(),
            report_seconds.to_string(),
        ],
        controller_kubeconfig.map(std::path::Path::to_path_buf),
    )
}

/// Waits until the ClusterLifecycle satisfies `done`; fails with what it was.
pub async fn wait_lifecycle(
    op: &mut Operator,
    what: &str,
    done: impl Fn(&ClusterLifecycle) -> bool,
) -> Result<ClusterLifecycle> {
    let api: Api<ClusterLifecycle> = Api::all(op.client.clone());
    let started = Instant::now();
    loop {
        op.procs.check_alive()?;
        let current = api.get_opt("cluster").await?;
        if let Some(c) = current.as_ref().filter(|c| done(c)) {
            return Ok(c.clone());
        }
        if started.elapsed() >= DEADLINE {
            bail!(
                "ClusterLifecycle: not {what} within {DEADLINE:?}; it is {}\nlogs: {}",
                serde_json::to_string_pretty(&current).unwrap_or_default(),
                op.procs.logs().display()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Waits until the ClusterLifecycle of `op`'s instance has generated exactly one Operation
/// and returns it; fails when it generates more than one, or none within [`DEADLINE`]
/// (`what` names the kind expected, for the message).
pub async fn wait_one_generated(
    op: &mut Operator,
    what: &str,
) -> Result<bosun_api::operation::Operation> {
    let ops: Api<bosun_api::operation::Operation> = Api::all(op.client.clone());
    let selector = format!("bosun.dev/instance={},bosun.dev/lifecycle", op.instance);
    let started = Instant::now();
    loop {
        op.procs.check_alive()?;
        let found = ops
            .list(&ListParams::default().labels(&selector))
            .await?
            .items;
        ensure!(
            found.len() <= 1,
            "more than one Operation generated: {:?}",
            found
                .iter()
                .map(|o| o.metadata.name.clone())
                .collect::<Vec<_>>()
        );
        if let Some(o) = found.into_iter().next() {
            return Ok(o);
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "no {what} generated within {DEADLINE:?}; logs in {}",
            op.procs.logs().display()
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The status of condition `type_` (`"True"`, `"False"`), if the status has it.
pub fn condition(c: &ClusterLifecycle, type_: &str) -> Option<String> {
    c.status
        .as_ref()?
        .conditions
        .iter()
        .find(|x| x.type_ == type_)
        .map(|x| x.status.clone())
}

/// The message of `c`'s condition `type_` (empty when it has none).
pub fn condition_message(c: &ClusterLifecycle, type_: &str) -> String {
    c.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|x| x.type_ == type_))
        .map(|x| x.message.clone())
        .unwrap_or_default()
}

/// `status.waiting` is `what`.
pub fn waiting_is(c: &ClusterLifecycle, what: &str) -> bool {
    c.status
        .as_ref()
        .is_some_and(|s| s.waiting.as_deref() == Some(what))
}

/// The status describes the current spec.
pub fn current(c: &ClusterLifecycle) -> bool {
    c.status
        .as_ref()
        .is_some_and(|s| s.observed_generation == c.metadata.generation)
}
