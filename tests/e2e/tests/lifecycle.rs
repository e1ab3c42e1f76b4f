//! The declarative layer end to end (docs/lifecycle.md): the ClusterLifecycle `cluster`,
//! the agents' NodeReports, and the Operations the controller generates, against the lab's
//! real API server with the real controller and agents.
//!
//! - Adoption: a controller that finds no ClusterLifecycle creates one from kubeadm's
//!   `kubeadm-config` ConfigMap (created here as kubeadm would: the lab has none), the
//!   agents report their nodes, the status turns InSync, and no Operation starts.
//! - A `rotation` bump generates exactly one renewal Operation; it blocks (the lab has no
//!   `certs` plugin), which holds further generation (a second bump generates nothing)
//!   until a person skips the blocked tasks; then the second bump's renewal is generated.
//! - `autoRenew` with a `renewBefore` covering the lab's certificates generates a renewal,
//!   but not with one as long as the validity a renewal gives (`RenewBeforeTooLong`).
//! - A one-minor `kubernetesVersion` bump generates one upgrade Operation with the
//!   ClusterLifecycle's defaults (DryRun here), which the controller plans; also when the
//!   bump is made while every connection of the controller's is stalled (a relay in front
//!   of the API server holds what comes back).
//! - The API server refuses a downgrade, a skipped minor, a rotation decrease, a malformed
//!   version and another name, with messages that say so.
//! - `paused` generates nothing; deleting the ClusterLifecycle deletes no Operation.
//! - An operation Policy blocks a generated Operation as any other, and the
//!   ClusterLifecycle waits for it.
//! - An Operation made by hand under a generated name is not taken as generated
//!   (`NameTaken`); once it is gone, the ClusterLifecycle generates its own, uid-labelled.
//! - An agent's token may write only its own node's NodeReport.
//! - A kubectl package behind the version (a dpkg database written into a worker's root)
//!   is reported by the agent and is `PackageDrift`, which generates the upgrade.
//! - A worker whose root gets Debian's `/run/reboot-required` (and `.pkgs`) is reported as
//!   needing a reboot, with the packages; the ClusterLifecycle counts and names it, stays
//!   InSync and generates nothing; `kubectl bosun status` shows it with the reason; removing
//!   the sentinel (what a reboot does to `/run`) clears all three.
//!
//! The ClusterLifecycle is one per cluster: every test here takes the lab-nodes lock and
//! starts from none. Build the binaries first (`cargo build --workspace --bins`).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use bosun_api::lifecycle::{ClusterLifecycle, parse_version};
use bosun_api::node_report::NodeReport;
use bosun_api::node_task::NodeTaskPhase;
use bosun_api::operation::{ExecutionMode, Operation};
use bosun_e2e::identity::{
    AGENT_SA, agent_pod, apply_deploy_file, client_with_token, forbidden, kubectl, token_of,
};
use bosun_e2e::lifecycle::{
    self, condition, condition_message, current, delete_lifecycle, lab_version, start,
    wait_lifecycle, waiting_is,
};
use bosun_e2e::operator::phase_of;
use bosun_e2e::{DEADLINE, MANAGER, Operator, apply_crds, events_about, lock_lab_nodes, unique};
use bosun_lab::{LabHandle, Role};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const POLL: Duration = Duration::from_millis(250);

/// Starts every test from the same place: the lab as [`lifecycle::reset`] leaves it, and
/// no `certs` Plugin.
///
/// The lab outlives test runs, and another binary's renewal test (tests/plugins'
/// `e2e_renew`) publishes `certs` and leaves it. With it, the renewals generated here would
/// run for real and restart the lab's control plane, and a test ending mid-restart would
/// leave a manifest moved aside for the next test to trip on. Without it they block, which
/// is what the tests here need; `e2e_renew` publishes it again when it runs.
async fn fresh(lab: &LabHandle) -> Result<()> {
    lifecycle::reset(lab).await?;
    let plugins: Api<bosun_api::Plugin> = Api::all(lab.client.clone());
    if plugins.get_opt("certs").await?.is_some() {
        plugins
            .delete("certs", &DeleteParams::default())
            .await
            .context("deleting the lab's `certs` Plugin so that generated renewals block")?;
    }
    Ok(())
}

async fn cleanup(lab: &LabHandle) -> Result<()> {
    lifecycle::remove(lab).await
}

/// The Operations the ClusterLifecycle of `op`'s instance generated.
async fn generated(op: &Operator) -> Result<Vec<Operation>> {
    let ops: Api<Operation> = Api::all(op.client.clone());
    Ok(ops
        .list(&ListParams::default().labels(&format!(
            "bosun.dev/instance={},bosun.dev/lifecycle",
            op.instance
        )))
        .await?
        .items)
}

/// Every Operation of `op`'s instance, generated or not.
async fn all_operations(op: &Operator) -> Result<Vec<Operation>> {
    let ops: Api<Operation> = Api::all(op.client.clone());
    Ok(ops
        .list(&ListParams::default().labels(&format!("bosun.dev/instance={}", op.instance)))
        .await?
        .items)
}

async fn patch_spec(client: &Client, spec: Value) -> Result<()> {
    let api: Api<ClusterLifecycle> = Api::all(client.clone());
    api.patch(
        "cluster",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": spec })),
    )
    .await
    .with_context(|| format!("patching the ClusterLifecycle's spec with {spec}"))?;
    Ok(())
}

/// Adopted and in sync: the spec is the cluster's, every node reported.
async fn adopted_in_sync(op: &mut Operator, lab: &LabHandle) -> Result<ClusterLifecycle> {
    let control_planes = lab.names(Role::ControlPlane).len() as u32;
    let nodes = lab.nodes.len() as u32;
    wait_lifecycle(
        op,
        "adopted, InSync, with every control plane's certificates",
        |c| {
            current(c)
                && condition(c, "InSync").as_deref() == Some("True")
                && c.status.as_ref().is_some_and(|s| {
                    s.certificates.nodes_reported >= control_planes
                        && s.versions.nodes_at_desired >= nodes
                })
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_install_adopts_the_cluster_as_it_is_and_starts_nothing() -> Result<()> {
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    fresh(&lab).await?;
    let mut op = start(&lab, "lifecycle-adopt")?;
    let adopted = adopted_in_sync(&mut op, &lab).await?;

    ensure!(
        adopted.spec.kubernetes_version == lab_version(&lab),
        "adopted version {} is not the cluster's {}",
        adopted.spec.kubernetes_version,
        lab_version(&lab)
    );
    ensure!(
        !adopted.spec.certificates.auto_renew && adopted.spec.certificates.rotation == 0,
        "adoption must not renew anything: {:?}",
        adopted.spec.certificates
    );
    ensure!(
        adopted.labels().get("bosun.dev/instance") == Some(&op.instance),
        "adopted for this instance: {:?}",
        adopted.labels()
    );
    let status = adopted.status.clone().unwrap_or_default();
    ensure!(
        status.waiting.is_none() && status.history.is_empty(),
        "nothing waits, nothing generated: {status:?}"
    );
    ensure!(
        condition(&adopted, "Progressing").as_deref() == Some("False"),
        "not progressing: {status:?}"
    );
    // The earliest renewable certificate is one of a control plane's (CAs left out).
    let earliest = status
        .certificates
        .earliest
        .clone()
        .context("the earliest certificate is shown")?;
    let cp = lab
        .nodes
        .iter()
        .find(|n| n.role == Role::ControlPlane)
        .context("the lab has a control plane")?;
    ensure!(
        earliest.starts_with(&format!("{}/", cp.name)) && !earliest.ends_with("/ca"),
        "earliest certificate {earliest}"
    );
    ensure!(
        status
            .summary
            .as_deref()
            .is_some_and(|s| s.starts_with(&format!(
                "{n}/{n} nodes at {}",
                lab_version(&lab),
                n = lab.nodes.len()
            ))),
        "summary: {:?}",
        status.summary
    );

    // Every node's report comes, with its kubelet's version and OS. (Being in sync needs
    // only the control planes' reports, for their certificates: a worker's agent may still
    // be writing its first one.)
    let reports: Api<NodeReport> = Api::all(lab.client.clone());
    for node in &lab.nodes {
        let started = Instant::now();
        let r = loop {
            if let Some(r) = reports
                .get_opt(&node.name)
                .await
                .with_context(|| format!("reading the NodeReport of {}", node.name))?
            {
                break r;
            }
            ensure!(
                started.elapsed() < DEADLINE,
                "{}'s agent wrote no NodeReport",
                node.name
            );
            tokio::time::sleep(POLL).await;
        };
        ensure!(
            r.spec.facts.kubelet_version.as_deref() == Some(lab_version(&lab).as_str()),
            "{}: kubelet {:?}",
            node.name,
            r.spec.facts.kubelet_version
        );
        ensure!(
            r.spec.facts.os.as_deref() == Some(node.os.as_str()),
            "{}: os {:?}",
            node.name,
            r.spec.facts.os
        );
        if node.role == Role::ControlPlane {
            ensure!(
                !r.spec.facts.certificates.is_empty(),
                "{}: certificates reported",
                node.name
            );
        }
    }
    // Nothing changed on the nodes: the agents (reading every second) write nothing more.
    let before: Vec<Option<String>> = reports
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|r| r.resource_version())
        .collect();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after: Vec<Option<String>> = reports
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|r| r.resource_version())
        .collect();
    ensure!(
        before == after,
        "a NodeReport was rewritten though nothing changed"
    );
    let ops = all_operations(&op).await?;
    ensure!(
        ops.is_empty(),
        "a fresh install started Operations: {:?}",
        ops.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );

    // `kubectl bosun status` without an Operation shows the ClusterLifecycle.
    let text = bosun_status(&lab)?;
    ensure!(
        text.starts_with(&format!(
            "ClusterLifecycle cluster  InSync  desired {}",
            lab_version(&lab)
        )) && text.contains("no Operation generated")
            && text.contains(&format!("certificates: earliest {earliest} expires")),
        "kubectl bosun status:\n{text}"
    );
    cleanup(&lab).await?;
    op.finish().await
}

/// Skips every Blocked task of `name` until it finishes.
async fn skip_until_finished(op: &mut Operator, name: &str) -> Result<Operation> {
    let started = Instant::now();
    let ops: Api<Operation> = Api::all(op.client.clone());
    loop {
        op.procs.check_alive()?;
        let current = ops.get(name).await?;
        if phase_of(&current).is_finished() {
            return Ok(current);
        }
        for (_, task) in op.tasks(name).await? {
            let s = task.status.clone().unwrap_or_default();
            if s.phase == NodeTaskPhase::Blocked && task.spec.recovery.is_none() {
                op.patch_task_spec(&task.name_any(), json!({ "recovery": "Skip" }))
                    .await?;
            }
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "Operation {name} did not finish after skipping its blocked tasks\n{}",
            bosun_e2e::describe_tasks(&op.client, name).await
        );
        tokio::time::sleep(POLL).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_bump_renews_once_and_a_blocked_renewal_holds_generation() -> Result<()> {
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    fresh(&lab).await?;
    let plugins: Api<bosun_api::Plugin> = Api::all(lab.client.clone());
    ensure!(
        plugins.get_opt("certs").await?.is_none(),
        "this test needs the lab without a `certs` Plugin (its renewal must block)"
    );
    let mut op = start(&lab, "lifecycle-rotate")?;
    adopted_in_sync(&mut op, &lab).await?;

    patch_spec(&lab.client, json!({ "certificates": { "rotation": 1 } })).await?;
    let c = wait_lifecycle(&mut op, "blocked on its renewal r1", |c| {
        current(c) && waiting_is(c, "BlockedOperation")
    })
    .await?;
    let status = c.status.clone().unwrap_or_default();
    ensure!(
        status.certificates.handled_rotation == 0,
        "rotation 1 is not handled while its renewal is Blocked (handled means succeeded): {status:?}"
    );
    ensure!(
        status.current_operation.as_deref() == Some("lifecycle-renew-r1"),
        "current operation: {status:?}"
    );
    ensure!(
        condition(&c, "Progressing").as_deref() == Some("True")
            && condition(&c, "InSync").as_deref() == Some("False"),
        "progressing (blocked), and not in sync while the renewal is Blocked: {status:?}"
    );
    let ops = generated(&op).await?;
    ensure!(
        ops.len() == 1 && ops[0].name_any() == "lifecycle-renew-r1",
        "exactly one renewal: {:?}",
        ops.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );
    let renewal = &ops[0];
    ensure!(
        renewal.spec.renew_certificates.is_some()
            && renewal.metadata.owner_references.is_none()
            && renewal
                .labels()
                .get("bosun.dev/lifecycle")
                .map(String::as_str)
                == Some("renewCertificates"),
        "a labelled renewal with no owner: {:?}",
        renewal.metadata
    );

    // A second bump while r1 is Blocked generates nothing.
    patch_spec(&lab.client, json!({ "certificates": { "rotation": 2 } })).await?;
    let c = wait_lifecycle(&mut op, "the second bump seen, still blocked", current).await?;
    let status = c.status.clone().unwrap_or_default();
    ensure!(
        status.waiting.as_deref() == Some("BlockedOperation")
            && status.certificates.handled_rotation == 0,
        "held by the blocked r1: {status:?}"
    );
    ensure!(
        generated(&op).await?.len() == 1,
        "nothing generated while r1 is Blocked"
    );

    // A person skips r1's blocked tasks: it finishes, and rotation 2 (the one now asked
    // for) is generated.
    skip_until_finished(&mut op, "lifecycle-renew-r1").await?;
    let c = wait_lifecycle(&mut op, "rotation 2's renewal generated", |c| {
        c.status
            .as_ref()
            .is_some_and(|s| s.current_operation.as_deref() == Some("lifecycle-renew-r2"))
    })
    .await?;
    let mut names: Vec<String> = generated(&op)
        .await?
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    names.sort();
    ensure!(
        names == ["lifecycle-renew-r1", "lifecycle-renew-r2"],
        "one renewal per bump: {names:?}"
    );
    let history: Vec<String> = c
        .status
        .clone()
        .unwrap_or_default()
        .history
        .iter()
        .map(|h| h.name.clone())
        .collect();
    ensure!(
        history == ["lifecycle-renew-r2", "lifecycle-renew-r1"],
        "history, newest first: {history:?}"
    );
    skip_until_finished(&mut op, "lifecycle-renew-r2").await?;
    // r2 finished with its nodes skipped: the rotation is not used up silently. It stays
    // unhandled, the status says why and what to do, and nothing more is generated.
    let c = wait_lifecycle(&mut op, "r2 finished without effect", |c| {
        c.status.as_ref().is_some_and(|s| {
            s.current_operation.is_none()
                && s.waiting.as_deref() == Some("OperationFinishedWithoutEffect")
        })
    })
    .await?;
    let status = c.status.clone().unwrap_or_default();
    let progressing = condition_message(&c, "Progressing");
    ensure!(
        status.certificates.handled_rotation == 0
            && condition(&c, "InSync").as_deref() == Some("False")
            && progressing.contains("lifecycle-renew-r2")
            && progressing.contains("skipped or gone")
            && progressing.contains("raise certificates.rotation to 3"),
        "a skipped renewal leaves the rotation unhandled and says so: {progressing} / {status:?}"
    );
    ensure!(generated(&op).await?.len() == 2, "no third renewal");
    cleanup(&lab).await?;
    op.finish().await
}

/// A name squatter (issue 33): an Operation made by hand under the name a rotation bump
/// would generate (`lifecycle-renew-r1`) is not taken as the renewal. Nothing is generated,
/// rotation 1 stays unhandled, and the status says `waiting: NameTaken` naming the
/// Operation and what to do; once it is deleted, the renewal is generated, labelled with
/// the ClusterLifecycle's uid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_made_by_hand_under_a_generated_name_is_not_taken_as_generated() -> Result<()>
{
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    fresh(&lab).await?;
    let mut op = start(&lab, "lifecycle-squat")?;
    let adopted = adopted_in_sync(&mut op, &lab).await?;
    // No instance label: no controller of these tests acts on it; it only holds the name.
    let ops: Api<Operation> = Api::all(lab.client.clone());
    let squatter: Operation = serde_json::from_value(json!({
        "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation",
        "metadata": { "name": "lifecycle-renew-r1" },
        "spec": {
            "nodeSelector": { "matchLabels": { "bosun.dev/e2e-squatter": "none" } },
            "custom": { "groups": [{ "name": "x", "steps": [{ "name": "uncordon", "runsOn": "controller", "action": "uncordon" }] }] },
        },
    }))?;
    if ops.get_opt("lifecycle-renew-r1").await?.is_some() {
        ops.delete("lifecycle-renew-r1", &DeleteParams::default())
            .await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    ops.create(&PostParams::default(), &squatter)
        .await
        .context("creating the squatter lifecycle-renew-r1")?;
    let r: Result<()> = async {
        patch_spec(&lab.client, json!({ "certificates": { "rotation": 1 } })).await?;
        let c = wait_lifecycle(&mut op, "waiting NameTaken", |c| {
            current(c) && waiting_is(c, "NameTaken")
        })
        .await?;
        let status = c.status.clone().unwrap_or_default();
        ensure!(
            status.certificates.handled_rotation == 0,
            "rotation 1 is not handled by a squatter: {status:?}"
        );
        ensure!(
            status.history.is_empty(),
            "no renewal in the history: {:?}",
            status.history
        );
        let progressing = condition_message(&c, "Progressing");
        for needle in [
            "lifecycle-renew-r1",
            "was not generated by a ClusterLifecycle",
            "kubectl delete operation lifecycle-renew-r1",
        ] {
            ensure!(
                progressing.contains(needle),
                "the Progressing message names {needle:?}: {progressing}"
            );
        }
        ensure!(generated(&op).await?.is_empty(), "nothing generated");

        ops.delete("lifecycle-renew-r1", &DeleteParams::default())
            .await?;
        let c = wait_lifecycle(
            &mut op,
            "rotation 1's renewal generated once the name is free",
            |c| {
                c.status
                    .as_ref()
                    .is_some_and(|s| s.current_operation.as_deref() == Some("lifecycle-renew-r1"))
            },
        )
        .await?;
        let renewal = generated(&op).await?;
        ensure!(
            renewal.len() == 1 && renewal[0].name_any() == "lifecycle-renew-r1",
            "the renewal generated: {renewal:?}"
        );
        let uid = renewal[0].labels().get("bosun.dev/lifecycle-uid").cloned();
        ensure!(
            uid.is_some() && uid == c.metadata.uid && uid == adopted.metadata.uid,
            "labelled with the ClusterLifecycle's uid: {uid:?}"
        );
        Ok(())
    }
    .await;
    if r.is_err() {
        let _ = ops
            .delete("lifecycle-renew-r1", &DeleteParams::default())
            .await;
    }
    r?;
    cleanup(&lab).await?;
    op.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_within_renew_before_generate_a_renewal_with_auto_renew() -> Result<()> {
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    fresh(&lab).await?;
    let mut op = start(&lab, "lifecycle-due")?;
    let c = adopted_in_sync(&mut op, &lab).await?;
    let earliest = c
        .status
        .clone()
        .unwrap_or_default()
        .certificates
        .earliest_expiry
        .context("earliest expiry")?;

    // The lab's certificates expire in about a year. A renewBefore of 3000 days covers them,
    // but it is longer than the year a renewal gives (kubeadm's default: the lab's
    // kubeadm-config sets no certificateValidityPeriod), so every renewal would be due again
    // at once: reported, and with autoRenew nothing is generated.
    patch_spec(
        &lab.client,
        json!({ "certificates": { "renewBefore": "3000d" }, "paused": false }),
    )
    .await?;
    let c = wait_lifecycle(&mut op, "RenewBeforeTooLong reported", |c| {
        current(c) && not_in_sync_because(c, "RenewBeforeTooLong").is_some()
    })
    .await?;
    let why = not_in_sync_because(&c, "RenewBeforeTooLong").unwrap_or_default();
    ensure!(
        why.contains("renewBefore 3000d is not shorter than the 365d a renewal gives")
            && why.contains("kubeadm's default")
            && why.contains("for example 30d"),
        "the message names the bound and what to set: {why}"
    );
    patch_spec(
        &lab.client,
        json!({ "certificates": { "autoRenew": true } }),
    )
    .await?;
    let c = wait_lifecycle(&mut op, "waiting: RenewBeforeTooLong", |c| {
        current(c) && waiting_is(c, "RenewBeforeTooLong")
    })
    .await?;
    ensure!(
        generated(&op).await?.is_empty(),
        "a renewal that cannot make the certificates fresh is not generated: {:?}",
        c.status
    );

    // A renewBefore just over the earliest certificate's remaining life, and under a
    // year: due, and a renewal would make it fresh. That window is the certificate's age, so
    // wait until it is at least 90 s old (kubeadm's notAfter is its issue time + 365d).
    let year = SignedDuration::from_hours(8760);
    let old_enough = earliest.0 - year + SignedDuration::from_secs(90);
    if let Ok(wait) = Duration::try_from(old_enough.duration_since(Timestamp::now())) {
        tokio::time::sleep(wait).await;
    }
    let remaining = earliest.0.duration_since(Timestamp::now());
    let minutes = remaining.as_secs() / 60 + 1;
    ensure!(minutes * 60 < year.as_secs(), "window: {minutes}m");
    // Without autoRenew that is reported, not acted on.
    patch_spec(
        &lab.client,
        json!({ "certificates": { "renewBefore": format!("{minutes}m"), "autoRenew": false } }),
    )
    .await?;
    let c = wait_lifecycle(&mut op, "CertificatesDue reported", |c| {
        current(c) && not_in_sync_because(c, "CertificatesDue").is_some()
    })
    .await?;
    ensure!(
        c.status.as_ref().is_some_and(|s| s.waiting.is_none()),
        "nothing awaited without autoRenew: {:?}",
        c.status
    );
    ensure!(generated(&op).await?.is_empty(), "no autoRenew, no renewal");

    patch_spec(
        &lab.client,
        json!({ "certificates": { "autoRenew": true } }),
    )
    .await?;
    let c = wait_lifecycle(&mut op, "a renewal generated", |c| {
        c.status
            .as_ref()
            .is_some_and(|s| s.current_operation.is_some())
    })
    .await?;
    let ops = generated(&op).await?;
    let expected = format!(
        "lifecycle-renew-exp-{}",
        earliest.0.strftime("%Y%m%d-%H%M%S")
    );
    ensure!(
        ops.len() == 1 && ops[0].name_any() == expected,
        "one renewal named after the expiry {expected}: {:?}",
        ops.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );
    let status = c.status.unwrap_or_default();
    ensure!(
        status.certificates.next_renewal.is_some(),
        "the planned renewal time is shown: {status:?}"
    );
    cleanup(&lab).await?;
    op.finish().await
}

/// `deploy/admission/clusterlifecycle-warnings.yaml`: `autoRenew` with a zero `renewBefore`
/// is accepted with a warning that says why it is a bad idea and what to set; a margin, or
/// no autoRenew, gets none. Server-side dry runs of a create: nothing is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_renew_before_with_auto_renew_is_accepted_with_a_warning() -> Result<()> {
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    fresh(&lab).await?;
    apply_deploy_file(&lab, "deploy/admission/clusterlifecycle-warnings.yaml").await?;
    let version = lab_version(&lab);
    let dir = tempfile::tempdir()?;
    let dry_run = |auto: bool, before: &str| -> Result<String> {
        let path = dir.path().join(format!("{auto}-{before}.yaml"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: bosun.dev/v1alpha1\nkind: ClusterLifecycle\nmetadata:\n  name: cluster\nspec:\n  kubernetesVersion: {version}\n  certificates:\n    autoRenew: {auto}\n    renewBefore: {before}\n"
            ),
        )?;
        let path = path.to_string_lossy().into_owned();
        let out = kubectl(&lab, &["create", "--dry-run=server", "-f", &path])?;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        ensure!(
            out.status.success(),
            "autoRenew {auto}, renewBefore {before} is accepted: {stderr}"
        );
        Ok(stderr)
    };
    // The policy applies once the API server's admission informer has it.
    let started = Instant::now();
    let warning = loop {
        let stderr = dry_run(true, "0d")?;
        if stderr.contains("Warning:") {
            break stderr;
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "no warning for autoRenew with renewBefore 0d within {DEADLINE:?}: {stderr}"
        );
        tokio::time::sleep(POLL).await;
    };
    ensure!(
        warning.contains("spec.certificates.renewBefore is zero")
            && warning.contains("renewed only after it has expired")
            && warning.contains("such as 30d"),
        "the warning says what is wrong and what to set: {warning}"
    );
    for before in ["0d0h0m", "0h", "00m"] {
        let stderr = dry_run(true, before)?;
        ensure!(stderr.contains("renewBefore is zero"), "{before}: {stderr}");
    }
    for (auto, before) in [(true, "30d"), (true, "1m"), (false, "0d")] {
        let stderr = dry_run(auto, before)?;
        ensure!(
            !stderr.contains("Warning:"),
            "autoRenew {auto}, renewBefore {before}: no warning: {stderr}"
        );
    }
    ensure!(
        Api::<ClusterLifecycle>::all(lab.client.clone())
            .get_opt("cluster")
            .await?
            .is_none(),
        "dry runs store nothing"
    );
    cleanup(&lab).await
}

/// Removes the `bosun-lifecycle-labels` policy and its binding when dropped: in the lab the
/// tests' controllers run as the lab's administrator, not as bosun-controller, so the policy
/// would refuse their generated Operations in every later test.
struct LabelsPolicyRemoved(LabHandle);

impl Drop for LabelsPolicyRemoved {
    fn drop(&mut self) {
        for kind in [
            "validatingadmissionpolicybinding",
            "validatingadmissionpolicy",
        ] {
            let _ = kubectl(
                &self.0,
                &[
                    "delete",
                    kind,
                    "bosun-lifecycle-labels",
                    "--ignore-not-found",
                    "--wait=true",
                ],
            );
        }
    }
}

/// `deploy/admission/lifecycle-labels.yaml`: the labels by which a ClusterLifecycle knows
/// its generated Operations cannot be forged by someone allowed to create Operations (the
/// lab's administrator here: the policy binds everyone but bosun-controller's service
/// account). A create carrying either label is refused with a message saying whose they
/// are; the same Operation without them is created; adding one later is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_controller_may_mark_an_operation_as_generated() -> Result<()> {
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    fresh(&lab).await?;
    let _removed = LabelsPolicyRemoved(lab.clone());
    apply_deploy_file(&lab, "deploy/admission/lifecycle-labels.yaml").await?;
    let ops: Api<Operation> = Api::all(lab.client.clone());
    let name = unique("forged-lifecycle");
    let operation = |labels: Value| -> Result<Operation> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "bosun.dev/v1alpha1", "kind": "Operation",
            "metadata": { "name": name, "labels": labels },
            "spec": {
                "paused": true,
                "nodeSelector": { "matchLabels": { "bosun.dev/e2e-forged": "none" } },
                "renewCertificates": { "certificates": ["all"] },
            },
        }))?)
    };
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    // The policy applies once the API server's admission informer has it.
    let started = Instant::now();
    let refusal = loop {
        let result = ops
            .create(
                &dry_run,
                &operation(json!({ "bosun.dev/lifecycle": "renewCertificates", "bosun.dev/lifecycle-uid": "0000" }))?,
            )
            .await;
        if let Some(m) = forbidden(&result) {
            break m;
        }
        ensure!(
            result.is_ok() && started.elapsed() < DEADLINE,
            "a forged generated Operation was not refused within {DEADLINE:?}: {result:?}"
        );
        tokio::time::sleep(POLL).await;
    };
    ensure!(
        refusal.contains("only bosun-controller may set or change them")
            && refusal.contains(&format!("leave them out of Operation {name}")),
        "{refusal}"
    );
    for labels in [
        json!({ "bosun.dev/lifecycle": "" }),
        json!({ "bosun.dev/lifecycle-uid": "0000" }),
    ] {
        let result = ops.create(&dry_run, &operation(labels.clone())?).await;
        ensure!(forbidden(&result).is_some(), "{labels}: {result:?}");
    }
    // Without them: an ordinary Operation. Adding one afterwards is refused.
    ops.create(
        &PostParams::default(),
        &operation(json!({ "bosun.dev/e2e": "plain" }))?,
    )
    .await
    .context("an Operation without the labels is created")?;
    let r: Result<()> = async {
        let result = ops
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "metadata": { "labels": { "bosun.dev/lifecycle": "renewCertificates" } } })),
            )
            .await;
        ensure!(forbidden(&result).is_some(), "adding the label: {result:?}");
        // Editing it otherwise stays allowed.
        ops.patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": { "bosun.dev/e2e": "edited" } } })),
        )
        .await
        .context("an edit that leaves the lifecycle labels alone")?;
        Ok(())
    }
    .await;
    ops.delete(&name, &DeleteParams::default()).await?;
    r?;
    cleanup(&lab).await
}

/// Sets the ClusterLifecycle's `kubernetesVersion` one minor up, its Operations in DryRun
/// (two nodes at a time), and waits until it generated the upgrade; returns the target
/// version, the upgrade's name and the ClusterLifecycle then.
async fn bump_minor_in_dry_run(
    lab: &LabHandle,
    op: &mut Operator,
) -> Result<(String, String, ClusterLifecycle)> {
    let (major, minor, _) = parse_version(&lab_version(lab)).context("the lab's version")?;
    let target = format!("v{major}.{}.0", minor + 1);
    patch_spec(
        &lab.client,
        json!({ "kubernetesVersion": target, "operationDefaults": { "executionMode": "DryRun", "rollout": { "maxUnavailable": 2 } } }),
    )
    .await?;
    let name = format!("lifecycle-upgrade-v{major}-{}-0", minor + 1);
    let c = wait_lifecycle(op, "upgrade generated", |c| {
        current(c)
            && c.status
                .as_ref()
                .is_some_and(|s| s.current_operation.as_deref() == Some(name.as_str()))
    })
    .await?;
    Ok((target, name, c))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minor_version_bump_generates_one_planned_upgrade() -> Result<()> {
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    fresh(&lab).await?;
    let mut op = start(&lab, "lifecycle-upgrade")?;
    adopted_in_sync(&mut op, &lab).await?;
    let (target, name, c) = bump_minor_in_dry_run(&lab, &mut op).await?;
    ensure!(
        condition(&c, "InSync").as_deref() == Some("False"),
        "behind the desired version: not in sync"
    );
    let planned = op
        .wait_operation(&name, "planned", |o| {
            o.status.as_ref().is_some_and(|s| s.plan.is_some())
        })
        .await?;
    ensure!(
        planned.spec.execution_mode == ExecutionMode::DryRun,
        "the defaults' mode: {:?}",
        planned.spec.execution_mode
    );
    let upgrade = planned.spec.upgrade.clone().context("an upgrade")?;
    ensure!(upgrade.kubernetes_version == target, "{upgrade:?}");
    ensure!(upgrade.packages.len() == 3, "packages follow: {upgrade:?}");
    let plan = planned
        .status
        .clone()
        .unwrap_or_default()
        .plan
        .unwrap_or_default();
    let planned_nodes = plan.node_names().count();
    ensure!(
        planned_nodes == lab.nodes.len(),
        "every node planned: {plan:?}"
    );
    ensure!(generated(&op).await?.len() == 1, "one upgrade at a time");
    cleanup(&lab).await?;
    op.finish().await
}

/// A person's edit is acted on even when every watch the controller has open reached an
/// API server that stopped delivering (the etcd member behind it stopped, as the real-node
/// stage's etcd gate does; there the controller once never saw a `kubernetesVersion` bump).
/// The controller reaches the API server through a relay that stalls every connection open
/// at the moment of the edit (bytes sent on, nothing returned, not even the end of
/// stream). The ClusterLifecycle watch is found behind by a list and opened again, the
/// upgrade is generated, and the Operation watch, which never brought the new Operation, is
/// found behind the same way, so the Operation is planned. No process restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_made_while_the_controllers_api_server_stalls_is_acted_on() -> Result<()> {
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    fresh(&lab).await?;
    let relay = bosun_e2e::stall::StallingRelay::start(lab.ports.apiserver).await?;
    let kubeconfig = relay.controller_kubeconfig(&lab, "e2e-lifecycle-stalled")?;
    let mut op = lifecycle::start_through(&lab, "lifecycle-stalled", &kubeconfig)?;
    adopted_in_sync(&mut op, &lab).await?;
    let before = op.procs.pids();
    ensure!(
        relay.stall_open_connections() > 0,
        "the controller reaches the API server through the relay"
    );
    let (_, name, _) = bump_minor_in_dry_run(&lab, &mut op).await?;
    op.wait_operation(&name, "planned", |o| {
        o.status.as_ref().is_some_and(|s| s.plan.is_some())
    })
    .await?;
    op.procs.check_alive()?;
    ensure!(
        op.procs.pids() == before,
        "every process kept its id: {before:?} -> {:?}",
        op.procs.pids()
    );
    let log = std::fs::read_to_string(op.procs.log_of("controller"))?;
    let reopened = |resource: &str, object: &str| {
        log.lines().any(|l| {
            l.contains("lists objects it does not show; watching again on a new connection")
                && l.contains(resource)
                && l.contains(object)
        })
    };
    ensure!(
        reopened("ClusterLifecycles", "cluster"),
        "the controller said it watched the ClusterLifecycle again after a list showed the edit; see {}",
        op.procs.log_of("controller").display()
    );
    ensure!(
        reopened("Operations", &name),
        "the controller said it watched Operations again after a list showed {name}; see {}",
        op.procs.log_of("controller").display()
    );
    ensure!(generated(&op).await?.len() == 1, "one upgrade at a time");
    cleanup(&lab).await?;
    op.finish().await
}

/// Withdrawing a requested upgrade (docs/lifecycle.md, "Withdrawing an upgrade"): a minor
/// bump generates an upgrade in Controlled mode, which waits for approval, so no node
/// moves; setting the version back is accepted (no node runs above it), the status says the
/// Operation is superseded and how to cancel it, and once it is deleted the ClusterLifecycle
/// is InSync and generates nothing again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requested_upgrade_is_withdrawn_by_setting_the_version_back() -> Result<()> {
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    fresh(&lab).await?;
    let mut op = start(&lab, "lifecycle-withdraw")?;
    adopted_in_sync(&mut op, &lab).await?;
    let version = lab_version(&lab);
    let (major, minor, _) = parse_version(&version).context("the lab's version")?;
    let target = format!("v{major}.{}.0", minor + 1);
    patch_spec(
        &lab.client,
        json!({ "kubernetesVersion": target, "operationDefaults": { "executionMode": "Controlled" } }),
    )
    .await?;
    let name = format!("lifecycle-upgrade-v{major}-{}-0", minor + 1);
    op.wait_operation(&name, "waiting for approval", |o| {
        o.status
            .as_ref()
            .is_some_and(|s| s.phase == bosun_api::operation::OperationPhase::AwaitingApproval)
    })
    .await?;

    patch_spec(&lab.client, json!({ "kubernetesVersion": version }))
        .await
        .context("setting the version back while no node has moved must be accepted")?;
    let c = wait_lifecycle(&mut op, "waiting: OperationSuperseded", |c| {
        current(c) && waiting_is(c, "OperationSuperseded")
    })
    .await?;
    let progressing = condition_message(&c, "Progressing");
    ensure!(
        progressing.contains(&format!("kubectl delete operation {name}"))
            && progressing.contains(&format!("spec.kubernetesVersion is now {version}")),
        "the status says how to cancel it: {progressing}"
    );
    ensure!(
        condition(&c, "InSync").as_deref() == Some("True"),
        "the nodes are where the spec says: {:?}",
        c.status
    );

    let ops: Api<Operation> = Api::all(lab.client.clone());
    ops.delete(&name, &DeleteParams::default()).await?;
    op.wait_gone(&name).await?;
    let c = wait_lifecycle(&mut op, "InSync, nothing awaited", |c| {
        current(c)
            && condition(c, "InSync").as_deref() == Some("True")
            && c.status
                .as_ref()
                .is_some_and(|s| s.waiting.is_none() && s.current_operation.is_none())
    })
    .await?;
    // A reconcile has run since the deletion (the status changed): had it regenerated the
    // upgrade, the Operation would be back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    ensure!(
        generated(&op).await?.is_empty(),
        "nothing generated again: {:?}",
        c.status
    );
    cleanup(&lab).await?;
    op.finish().await
}

/// Two edits while paused, each legal against the previous spec, together skip a minor
/// version: the controller holds the version against the nodes, generates nothing, and
/// says which node cannot get there and what to set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_the_nodes_cannot_reach_in_one_upgrade_is_not_generated() -> Result<()> {
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    fresh(&lab).await?;
    let mut op = start(&lab, "lifecycle-unreachable")?;
    adopted_in_sync(&mut op, &lab).await?;
    let (major, minor, _) = parse_version(&lab_version(&lab)).context("the lab's version")?;
    patch_spec(&lab.client, json!({ "paused": true })).await?;
    for version in [
        format!("v{major}.{}.0", minor + 1),
        format!("v{major}.{}.0", minor + 2),
    ] {
        patch_spec(&lab.client, json!({ "kubernetesVersion": version })).await?;
    }
    patch_spec(&lab.client, json!({ "paused": false })).await?;
    let c = wait_lifecycle(&mut op, "waiting: VersionNotReachable", |c| {
        current(c) && waiting_is(c, "VersionNotReachable")
    })
    .await?;
    let summary = c
        .status
        .clone()
        .unwrap_or_default()
        .summary
        .unwrap_or_default();
    let progressing = condition_message(&c, "Progressing");
    let said = format!("{summary} | {progressing}");
    ensure!(
        said.contains(&format!("skips a minor version for node {}", {
            let mut names: Vec<_> = lab.nodes.iter().map(|n| n.name.clone()).collect();
            names.sort();
            names[0].clone()
        })) && said.contains(&format!("set a v{major}.{} version first", minor + 1)),
        "the status names the node and what to set: {said}"
    );
    ensure!(
        generated(&op).await?.is_empty(),
        "nothing generated for a version the nodes cannot reach"
    );
    cleanup(&lab).await?;
    op.finish().await
}

/// The refusal message of a spec patch.
async fn refused(api: &Api<ClusterLifecycle>, spec: Value) -> Result<String> {
    match api
        .patch(
            "cluster",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
    {
        Ok(_) => bail!("the API server accepted {spec}"),
        Err(kube::Error::Api(e)) if e.code == 422 => Ok(e.message),
        Err(e) => bail!("{spec}: refused otherwise than as invalid: {e}"),
    }
}

/// Creates `object`, which the API server must refuse as invalid; returns its message.
async fn create_refused(api: &Api<ClusterLifecycle>, object: &ClusterLifecycle) -> Result<String> {
    match api.create(&PostParams::default(), object).await {
        Ok(_) => bail!("the API server accepted {}", serde_json::to_string(object)?),
        Err(kube::Error::Api(e)) if e.code == 422 => Ok(e.message),
        Err(e) => bail!("refused otherwise than as invalid: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_edits_are_refused_with_clear_messages() -> Result<()> {
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    apply_crds(&lab.client).await?;
    delete_lifecycle(&lab.client).await?;
    let api: Api<ClusterLifecycle> = Api::all(lab.client.clone());
    // Labelled with an instance nobody runs, so no controller acts on it.
    let instance = unique("lifecycle-invalid");
    let object = |name: &str, version: &str| -> Result<ClusterLifecycle> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "bosun.dev/v1alpha1", "kind": "ClusterLifecycle",
            "metadata": { "name": name, "labels": { "bosun.dev/instance": instance } },
            "spec": { "kubernetesVersion": version, "certificates": { "rotation": 2 } },
        }))?)
    };
    let m = create_refused(&api, &object("other", "v1.34.4")?).await?;
    ensure!(
        m.contains("a ClusterLifecycle must be named `cluster`"),
        "{m}"
    );
    let m = create_refused(&api, &object("cluster", "1.34")?).await?;
    ensure!(
        m.contains("spec.kubernetesVersion must be a version like v1.34.4"),
        "{m}"
    );
    api.create(&PostParams::default(), &object("cluster", "v1.34.4")?)
        .await
        .context("creating a valid ClusterLifecycle")?;

    let m = refused(&api, json!({ "kubernetesVersion": "v1.34.3" })).await?;
    ensure!(m.contains("cannot be lowered"), "{m}");
    let m = refused(&api, json!({ "kubernetesVersion": "v1.33.9" })).await?;
    ensure!(m.contains("cannot be lowered"), "{m}");
    let m = refused(&api, json!({ "kubernetesVersion": "v1.36.0" })).await?;
    ensure!(m.contains("cannot skip a minor version"), "{m}");
    let m = refused(&api, json!({ "kubernetesVersion": "v2.0.0" })).await?;
    ensure!(m.contains("cannot change its major version"), "{m}");
    ensure!(
        !m.contains("cannot be lowered"),
        "a major raise is not also called a lowering: {m}"
    );
    let m = refused(&api, json!({ "kubernetesVersion": "latest" })).await?;
    ensure!(m.contains("must be a version like v1.34.4"), "{m}");
    let m = refused(&api, json!({ "certificates": { "rotation": 1 } })).await?;
    ensure!(m.contains("rotation can only increase"), "{m}");
    // A replace that leaves certificates out sets rotation back to 0: the message says so.
    let mut whole = api.get("cluster").await?;
    whole.spec.certificates = Default::default();
    let m = match api.replace("cluster", &PostParams::default(), &whole).await {
        Err(kube::Error::Api(e)) if e.code == 422 => e.message,
        other => bail!("a replace without certificates.rotation was not refused: {other:?}"),
    };
    ensure!(
        m.contains("leaves spec.certificates.rotation out sets it back to 0"),
        "{m}"
    );
    let m = refused(&api, json!({ "certificates": { "renewBefore": "30x" } })).await?;
    ensure!(
        m.contains("renewBefore must be days, hours and minutes"),
        "{m}"
    );
    // What is allowed: a patch, the next minor, a rotation bump.
    for ok in [
        json!({ "kubernetesVersion": "v1.34.5" }),
        json!({ "kubernetesVersion": "v1.35.0" }),
        json!({ "certificates": { "rotation": 3 } }),
    ] {
        api.patch(
            "cluster",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": ok })),
        )
        .await
        .with_context(|| format!("{ok} must be accepted"))?;
    }
    // Withdrawing a requested upgrade: lowering is allowed down to the highest version a
    // node runs (status.versions.highest, the controller's observation: written here, as no
    // controller runs for this object), never below it.
    let observed = |highest: &str| json!({ "status": { "versions": { "nodes": 2, "nodesAtDesired": 0, "lowest": "v1.34.4", "highest": highest } } });
    api.patch_status(
        "cluster",
        &PatchParams::default(),
        &Patch::Merge(observed("v1.34.4")),
    )
    .await
    .context("writing status.versions")?;
    for ok in ["v1.34.5", "v1.34.4"] {
        api.patch(
            "cluster",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "kubernetesVersion": ok } })),
        )
        .await
        .with_context(|| format!("withdrawing to {ok}, no node above it, must be accepted"))?;
    }
    let m = refused(&api, json!({ "kubernetesVersion": "v1.34.3" })).await?;
    ensure!(
        m.contains("cannot be lowered below a version a node runs")
            && m.contains("Withdrawing an upgrade"),
        "{m}"
    );
    api.patch(
        "cluster",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "kubernetesVersion": "v1.35.0" } })),
    )
    .await?;
    api.patch_status(
        "cluster",
        &PatchParams::default(),
        &Patch::Merge(observed("v1.35.0")),
    )
    .await?;
    let m = refused(&api, json!({ "kubernetesVersion": "v1.34.9" })).await?;
    ensure!(m.contains("cannot be lowered"), "a node runs v1.35.0: {m}");
    delete_lifecycle(&lab.client).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_stops_generation_and_deleting_the_lifecycle_deletes_no_operation() -> Result<()> {
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    fresh(&lab).await?;
    let mut op = start(&lab, "lifecycle-pause")?;
    adopted_in_sync(&mut op, &lab).await?;
    patch_spec(
        &lab.client,
        json!({ "paused": true, "certificates": { "rotation": 1 } }),
    )
    .await?;
    let c = wait_lifecycle(&mut op, "waiting: Paused", |c| {
        current(c) && waiting_is(c, "Paused")
    })
    .await?;
    ensure!(
        c.status
            .clone()
            .unwrap_or_default()
            .certificates
            .handled_rotation
            == 0,
        "a paused rotation is not handled"
    );
    ensure!(
        generated(&op).await?.is_empty(),
        "paused: nothing generated"
    );

    patch_spec(&lab.client, json!({ "paused": false })).await?;
    wait_lifecycle(&mut op, "rotation 1 generated", |c| {
        c.status
            .as_ref()
            .is_some_and(|s| s.current_operation.as_deref() == Some("lifecycle-renew-r1"))
    })
    .await?;
    ensure!(
        generated(&op).await?.len() == 1,
        "one renewal once unpaused"
    );

    // Deleting the ClusterLifecycle leaves its Operation: no ownerReference, nothing for
    // the garbage collector to follow. (The controller adopts only on start, so it does not
    // come back either.)
    delete_lifecycle(&lab.client).await?;
    let ops: Api<Operation> = Api::all(lab.client.clone());
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(5) {
        ensure!(
            ops.get_opt("lifecycle-renew-r1").await?.is_some(),
            "deleting the ClusterLifecycle deleted its generated Operation"
        );
        tokio::time::sleep(POLL).await;
    }
    let lifecycles: Api<ClusterLifecycle> = Api::all(lab.client.clone());
    ensure!(
        lifecycles.get_opt("cluster").await?.is_none(),
        "the running controller does not adopt again"
    );
    cleanup(&lab).await?;
    op.finish().await
}

/// Anyone RBAC allows can still write or delete a node's report (an administrator here):
/// the node's agent watches its own report and writes it again from the node at once, with a
/// Warning Event naming who changed it, not at the end of its period (an hour here, so only
/// the watch can explain a restore).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_or_deleted_node_report_is_restored_by_its_agent() -> Result<()> {
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    fresh(&lab).await?;
    let mut op = lifecycle::start_with_report_period(&lab, "lifecycle-restore", 3600)?;
    adopted_in_sync(&mut op, &lab).await?;
    let node = lab.nodes[lab.nodes.len() - 1].name.clone();
    let reports: Api<NodeReport> = Api::all(lab.client.clone());
    let truth = reports.get(&node).await?.spec.facts;
    let kubelet = truth
        .kubelet_version
        .clone()
        .context("the report's kubelet version")?;

    let forger = PatchParams {
        field_manager: Some("report-forger".into()),
        ..Default::default()
    };
    reports
        .patch(
            &node,
            &forger,
            &Patch::Merge(json!({ "spec": { "facts": { "kubeletVersion": "v1.99.0" } } })),
        )
        .await
        .context("an administrator changing the report")?;
    let started = Instant::now();
    wait_report(
        &mut op,
        &node,
        "restored to the node's kubelet version",
        |r| r.spec.facts.kubelet_version.as_deref() == Some(kubelet.as_str()),
    )
    .await?;
    let restored_in = started.elapsed();
    let started = Instant::now();
    let note = loop {
        let found = events_about(&lab.client, &node, Some("NodeReportRestored"))
            .await?
            .into_iter()
            .find_map(|e| e.note);
        if let Some(note) = found {
            break note;
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "no NodeReportRestored Event about {node}"
        );
        tokio::time::sleep(POLL).await;
    };
    ensure!(
        note.contains("was changed by report-forger"),
        "the Event names who changed it: {note}"
    );

    reports.delete(&node, &DeleteParams::default()).await?;
    let started = Instant::now();
    wait_report(&mut op, &node, "written again after its deletion", |r| {
        r.metadata.deletion_timestamp.is_none()
            && r.spec.facts.kubelet_version.as_deref() == Some(kubelet.as_str())
    })
    .await?;
    eprintln!(
        "restored after a change in {restored_in:?}, after a deletion in {:?}",
        started.elapsed()
    );
    cleanup(&lab).await?;
    op.finish().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_may_write_only_its_own_nodes_report() -> Result<()> {
    // It forges a report the other tests' agents and controller read.
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    apply_crds(&lab.client).await?;
    apply_deploy_file(&lab, "deploy/agent/rbac.yaml").await?;
    apply_deploy_file(&lab, "deploy/admission/agent-own-node.yaml").await?;
    let [node_a, node_b] = [
        lab.nodes[lab.nodes.len() - 2].name.clone(),
        lab.nodes[lab.nodes.len() - 1].name.clone(),
    ];
    let run = unique("lifecycle-report");
    let pod = agent_pod(&lab.client, &format!("agent-{run}"), &node_a).await?;
    let agent =
        client_with_token(&lab, &token_of(&lab.client, AGENT_SA, Some(&pod)).await?).await?;
    let reports: Api<NodeReport> = Api::all(agent.clone());
    let report = |node: &str| {
        json!({
            "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeReport",
            "metadata": { "name": node },
            "spec": { "nodeName": node, "facts": { "collectedAt": "2026-12-01T00:00:00Z", "kubeletVersion": "v0.0.0-forged" } },
        })
    };
    let apply = PatchParams::apply("lifecycle-e2e").force();
    // Node B's report: refused by the policy once the API server has it.
    let started = Instant::now();
    let refusal = loop {
        let result = reports
            .patch(&node_b, &apply, &Patch::Apply(report(&node_b)))
            .await;
        if let Some(m) = forbidden(&result)
            && m.contains("bosun-agent-own-node")
        {
            break m;
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "the agent of {node_a} was never refused writing {node_b}'s NodeReport: {result:?}"
        );
        tokio::time::sleep(POLL).await;
    };
    ensure!(
        refusal.contains(&format!(
            "bosun-agent on node {node_a} may write only the NodeReport of its own node"
        )),
        "{refusal}"
    );
    // A report named after node A about node B: refused by the CRD's rule first.
    let mut mixed = report(&node_a);
    mixed["spec"]["nodeName"] = json!(node_b);
    let result = reports.patch(&node_a, &apply, &Patch::Apply(mixed)).await;
    ensure!(
        result.is_err(),
        "a report named after A about B was accepted"
    );
    // Its own, with a certificate "name" that is a path: refused by the schema, with the
    // field named.
    let mut pathy = report(&node_a);
    pathy["spec"]["facts"]["certificates"] =
        json!([{ "name": "../../etc/shadow", "notAfter": "0001-01-01T00:00:00Z" }]);
    match reports.patch(&node_a, &apply, &Patch::Apply(pathy)).await {
        Err(kube::Error::Api(e)) if e.code == 422 => ensure!(
            e.message.contains("certificates[0].name"),
            "the refusal names the field: {}",
            e.message
        ),
        other => {
            bail!("a certificate named ../../etc/shadow was not refused as invalid: {other:?}")
        }
    }
    // Its own: allowed. (Restore it from the real agent's facts afterwards: the next
    // lifecycle test's agents rewrite it anyway, as the facts differ.)
    reports
        .patch(&node_a, &apply, &Patch::Apply(report(&node_a)))
        .await
        .context("the agent of node A writing its own NodeReport")?;
    let admin: Api<NodeReport> = Api::all(lab.client.clone());
    admin
        .delete(&node_a, &DeleteParams::default())
        .await
        .context("removing the forged report")?;
    Ok(())
}

/// Generated Operations are ordinary Operations: an operation Policy that denies them
/// holds one exactly as it holds a hand-written one, the ClusterLifecycle waits with
/// `PolicyHold` (nobody needs to retry), and deleting the Policy lets the Operation be
/// planned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_gate_generated_operations_like_any_other() -> Result<()> {
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    fresh(&lab).await?;
    let mut op = start(&lab, "lifecycle-policy")?;
    adopted_in_sync(&mut op, &lab).await?;
    let policies: Api<bosun_api::Policy> = Api::all(lab.client.clone());
    let policy = format!("{}-board", op.instance);
    let message = "generated Operations wait for the change board (e2e)";
    policies
        .patch(
            &policy,
            &PatchParams::apply(MANAGER),
            &Patch::Apply(json!({
                "apiVersion": "bosun.dev/v1alpha1", "kind": "Policy",
                "metadata": { "name": policy, "labels": { "bosun.dev/instance": op.instance } },
                "spec": { "enforcement": "Deny", "rego": format!(
                    "package bosun.operation.e2e_lifecycle\n\ndeny contains msg if {{\n\tstartswith(input.operation.name, \"lifecycle-\")\n\tmsg := \"{message}\"\n}}\n"
                ) },
            })),
        )
        .await
        .context("creating the Policy")?;
    let started = Instant::now();
    while !policies
        .get(&policy)
        .await?
        .status
        .is_some_and(|s| s.compiled)
    {
        ensure!(
            started.elapsed() < DEADLINE,
            "the controller never compiled Policy {policy}"
        );
        tokio::time::sleep(POLL).await;
    }

    patch_spec(&lab.client, json!({ "certificates": { "rotation": 1 } })).await?;
    let blocked = op
        .wait_operation("lifecycle-renew-r1", "Blocked by the policy", |o| {
            o.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Blocked" && c.reason == "PolicyDenied")
            })
        })
        .await?;
    let status = blocked.status.clone().unwrap_or_default();
    ensure!(
        status.plan.is_none() && status.message.as_deref().unwrap_or("").contains(message),
        "held before planning with the policy's message: {status:?}"
    );
    let held = wait_lifecycle(&mut op, "waiting: PolicyHold", |c| {
        waiting_is(c, "PolicyHold")
    })
    .await?;
    let why = condition_message(&held, "Progressing");
    ensure!(
        why.contains("goes on by itself once the policies allow") && why.contains(message),
        "the ClusterLifecycle says the policy holds it, and that nobody needs to retry: {why}"
    );

    policies
        .delete(&policy, &DeleteParams::default())
        .await
        .context("deleting the Policy")?;
    op.wait_operation(
        "lifecycle-renew-r1",
        "planned once the Policy is gone",
        |o| o.status.as_ref().is_some_and(|s| s.plan.is_some()),
    )
    .await?;
    cleanup(&lab).await?;
    op.finish().await
}

/// Removes a directory made by a test when dropped (also when the test fails).
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The message of `c`'s InSync condition when it is False with `reason`.
fn not_in_sync_because(c: &ClusterLifecycle, reason: &str) -> Option<String> {
    c.status
        .as_ref()?
        .conditions
        .iter()
        .find(|x| x.type_ == "InSync" && x.status == "False" && x.reason == reason)
        .map(|x| x.message.clone())
}

/// A node whose kubectl package is behind the cluster's version: its agent reports the
/// packages of the node's dpkg database (written here: the lab's roots have no package
/// database of their own) and reads kubectl's version from it; the ClusterLifecycle
/// (`packages: FollowClusterVersion`, the default) reports `PackageDrift` naming the node
/// and package, generates nothing while paused, and once unpaused generates the upgrade to
/// the version, which moves the packages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_package_behind_the_version_is_drift_and_generates_the_upgrade() -> Result<()> {
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    let worker = first_worker(&lab)?;
    let dpkg = worker.host_root.join("var/lib/dpkg");
    ensure!(
        !dpkg.exists(),
        "{} exists, but the lab's roots have no package database of their own",
        dpkg.display()
    );
    fresh(&lab).await?;
    let mut op = start(&lab, "lifecycle-packages")?;
    adopted_in_sync(&mut op, &lab).await?;
    patch_spec(
        &lab.client,
        json!({ "paused": true, "operationDefaults": { "executionMode": "DryRun" } }),
    )
    .await?;

    let version = lab_version(&lab);
    let (major, minor, patch) = parse_version(&version).context("the lab's version")?;
    let (old_minor, old_patch) = if patch > 0 {
        (minor, patch - 1)
    } else {
        (minor - 1, 0)
    };
    let at_version = format!("{major}.{minor}.{patch}-1.1");
    let behind = format!("{major}.{old_minor}.{old_patch}-1.1");
    let _remove = RemoveOnDrop(dpkg.clone());
    std::fs::create_dir_all(&dpkg)?;
    std::fs::write(
        dpkg.join("status"),
        format!(
            "Package: kubeadm\nStatus: install ok installed\nVersion: {at_version}\n\n\
             Package: kubelet\nStatus: install ok installed\nVersion: {at_version}\n\n\
             Package: kubectl\nStatus: install ok installed\nVersion: {behind}\n"
        ),
    )?;

    // The agent (reading every second) reports what the database says.
    let reports: Api<NodeReport> = Api::all(lab.client.clone());
    let want = vec![
        ("kubeadm".to_string(), at_version.clone()),
        ("kubelet".to_string(), at_version.clone()),
        ("kubectl".to_string(), behind.clone()),
    ];
    let listed = |r: &NodeReport| -> Vec<(String, String)> {
        r.spec
            .facts
            .packages
            .iter()
            .map(|p| (p.name.clone(), p.version.clone()))
            .collect()
    };
    let report = wait_report(
        &mut op,
        &worker.name,
        &format!("listing packages {want:?}"),
        |r| listed(r) == want,
    )
    .await?;
    let kubectl = format!("v{major}.{old_minor}.{old_patch}");
    ensure!(
        report.spec.facts.kubectl_version.as_deref() == Some(kubectl.as_str()),
        "kubectl's version from the package database: {:?}",
        report.spec.facts.kubectl_version
    );
    ensure!(
        report.spec.facts.kubeadm_version.as_deref() == Some(version.as_str()),
        "kubeadm's version from the package database: {:?}",
        report.spec.facts.kubeadm_version
    );

    // Paused: the drift is reported, nothing is generated.
    let lag = format!("{}: kubectl {behind}", worker.name);
    let c = wait_lifecycle(&mut op, "PackageDrift while paused", |c| {
        current(c)
            && not_in_sync_because(c, "PackageDrift").is_some_and(|m| m.contains(&lag))
            && waiting_is(c, "Paused")
    })
    .await?;
    ensure!(
        c.status
            .as_ref()
            .is_some_and(|s| s.versions.nodes_at_desired == lab.nodes.len() as u32),
        "every kubelet is at the version: {:?}",
        c.status
    );
    ensure!(
        generated(&op).await?.is_empty(),
        "paused: nothing generated"
    );

    // Unpaused: the upgrade to the version (the one that moves the packages).
    patch_spec(&lab.client, json!({ "paused": false })).await?;
    let name = format!("lifecycle-upgrade-v{major}-{minor}-{patch}");
    wait_lifecycle(&mut op, "upgrade generated for the package", |c| {
        current(c)
            && c.status
                .as_ref()
                .is_some_and(|s| s.current_operation.as_deref() == Some(name.as_str()))
    })
    .await?;
    let ops = generated(&op).await?;
    ensure!(
        ops.len() == 1 && ops[0].name_any() == name,
        "one upgrade, {name}: {:?}",
        ops.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
    );
    let reason = ops[0]
        .annotations()
        .get("bosun.dev/lifecycle-reason")
        .cloned()
        .unwrap_or_default();
    ensure!(
        reason.contains("only in their packages") && reason.contains(&lag),
        "the reason names the package: {reason}"
    );
    let upgrade = ops[0].spec.upgrade.clone().context("an upgrade")?;
    ensure!(
        upgrade.kubernetes_version == version && upgrade.packages.len() == 3,
        "{upgrade:?}"
    );
    ensure!(
        ops[0].spec.execution_mode == ExecutionMode::DryRun,
        "the defaults' mode"
    );

    // Leave the node as it was, and its report too, before the next test's controller
    // reads it.
    drop(_remove);
    let started = Instant::now();
    while reports
        .get_opt(&worker.name)
        .await?
        .is_some_and(|r| !r.spec.facts.packages.is_empty())
    {
        ensure!(
            started.elapsed() < DEADLINE,
            "{}'s NodeReport still lists packages after the database was removed",
            worker.name
        );
        tokio::time::sleep(POLL).await;
    }
    cleanup(&lab).await?;
    op.finish().await
}

/// Reads `node`'s NodeReport every [`POLL`] (failing if the controller or an agent has
/// exited) until `done` holds for it; fails after [`DEADLINE`] saying `what` was awaited and
/// what the report last said.
async fn wait_report(
    op: &mut Operator,
    node: &str,
    what: &str,
    done: impl Fn(&NodeReport) -> bool,
) -> Result<NodeReport> {
    let reports: Api<NodeReport> = Api::all(op.client.clone());
    let started = Instant::now();
    loop {
        op.procs.check_alive()?;
        let r = reports.get_opt(node).await?;
        if let Some(r) = r.as_ref().filter(|r| done(r)) {
            return Ok(r.clone());
        }
        ensure!(
            started.elapsed() < DEADLINE,
            "NodeReport {node}: not {what} after {DEADLINE:?}; it says {:?}",
            r.map(|r| r.spec.facts)
        );
        tokio::time::sleep(POLL).await;
    }
}

/// The lab's first worker.
fn first_worker(lab: &LabHandle) -> Result<bosun_lab::LabNode> {
    lab.nodes
        .iter()
        .find(|n| n.role == Role::Worker)
        .cloned()
        .context("the lab has a worker")
}

/// What `kubectl bosun status` (no argument: the ClusterLifecycle) prints, uncoloured; fails
/// with its output when it fails.
fn bosun_status(lab: &LabHandle) -> Result<String> {
    let out = std::process::Command::new(bosun_e2e::binary("kubectl-bosun")?)
        .args(["status", "--kubeconfig"])
        .arg(&lab.kubeconfig)
        .env("NO_COLOR", "1")
        .env_remove("KUBECONFIG")
        .output()
        .context("running kubectl-bosun status")?;
    let text = String::from_utf8(out.stdout)?;
    ensure!(
        out.status.success(),
        "kubectl bosun status ({}):\n{text}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(text)
}

/// Removes files made by a test when dropped (also when the test fails).
struct RemoveFilesOnDrop(Vec<std::path::PathBuf>);

impl Drop for RemoveFilesOnDrop {
    fn drop(&mut self) {
        for f in &self.0 {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// The reboot part of `kubectl bosun status` (from its `reboots:` line to the blank line).
fn reboot_lines(lab: &LabHandle) -> Result<String> {
    let text = bosun_status(lab)?;
    let from = text
        .find("  reboots:")
        .with_context(|| format!("no reboots line in:\n{text}"))?;
    let end = text[from..]
        .find("\n\n")
        .map_or(text.len(), |e| from + e + 1);
    Ok(text[from..end].to_owned())
}

/// A worker that needs a reboot, the Debian way (docs/reboots.md): its agent reports it with
/// the packages that asked; the ClusterLifecycle counts and names it and generates nothing
/// (a reboot need is not version drift); `kubectl bosun status` shows the node and why; the
/// sentinel gone (as a reboot clears `/run`), all of it clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_needs_a_reboot_is_reported_counted_and_shown() -> Result<()> {
    let _nodes = lock_lab_nodes().await;
    let lab = bosun_lab::ensure_lab().await?;
    let worker = first_worker(&lab)?;
    let run = worker.host_root.join("run");
    let (sentinel, pkgs) = (
        run.join("reboot-required"),
        run.join("reboot-required.pkgs"),
    );
    ensure!(
        !sentinel.exists() && !pkgs.exists(),
        "{} exists before the test wrote it",
        sentinel.display()
    );
    fresh(&lab).await?;
    let mut op = start(&lab, "lifecycle-reboots")?;
    let nodes = lab.nodes.len() as u32;
    let c = adopted_in_sync(&mut op, &lab).await?;
    let seen = c.status.clone().unwrap_or_default().reboots;
    ensure!(
        seen.required == 0 && seen.nodes.is_empty(),
        "no lab node needs a reboot yet: {seen:?}"
    );
    ensure!(
        reboot_lines(&lab)?.starts_with("  reboots: none needed ("),
        "{}",
        reboot_lines(&lab)?
    );

    std::fs::create_dir_all(&run)?;
    let _remove = RemoveFilesOnDrop(vec![sentinel.clone(), pkgs.clone()]);
    std::fs::write(&pkgs, "linux-image-6.12.57+deb13-amd64\nlibc6\nlibc6\n")?;
    std::fs::write(&sentinel, "*** System restart required ***\n")?;
    let reason =
        "/run/reboot-required is present (asked for by linux-image-6.12.57+deb13-amd64, libc6)";

    // The agent (reading every second) reports it.
    let report = wait_report(&mut op, &worker.name, "saying it needs a reboot", |r| {
        r.spec.facts.reboot.as_ref().is_some_and(|r| r.required)
    })
    .await?;
    let reboot = report.spec.facts.reboot.context("the reboot need")?;
    ensure!(
        reboot.reasons == [reason]
            && reboot.packages == ["linux-image-6.12.57+deb13-amd64", "libc6"],
        "{}'s reboot need: {reboot:?}",
        worker.name
    );
    let c = wait_lifecycle(&mut op, "one node needing a reboot", |c| {
        current(c)
            && c.status
                .as_ref()
                .is_some_and(|s| s.reboots.required == 1 && s.reboots.nodes_reported == nodes)
    })
    .await?;
    let status = c.status.clone().unwrap_or_default();
    ensure!(
        status.reboots.nodes == [worker.name.clone()],
        "the node is named: {:?}",
        status.reboots
    );
    ensure!(
        condition(&c, "InSync").as_deref() == Some("True"),
        "a reboot need is not version drift: {:?}",
        status.conditions
    );
    let summary = status.summary.unwrap_or_default();
    ensure!(
        summary.contains(&format!("1 node needs a reboot ({})", worker.name)),
        "the summary says it: {summary}"
    );
    ensure!(
        generated(&op).await?.is_empty(),
        "a reboot need generates nothing without a reboot setting"
    );
    let shown = reboot_lines(&lab)?;
    ensure!(
        shown
            == format!(
                "  reboots: 1 of {nodes} reporting nodes needs one\n    {}: {reason}\n",
                worker.name
            ),
        "kubectl bosun status shows:\n{shown}"
    );

    // A reboot clears /run: so does the report, and the count.
    std::fs::remove_file(&sentinel)?;
    std::fs::remove_file(&pkgs)?;
    wait_lifecycle(&mut op, "no node needing a reboot", |c| {
        current(c)
            && c.status
                .as_ref()
                .is_some_and(|s| s.reboots.required == 0 && s.reboots.nodes_reported == nodes)
    })
    .await?;
    let reports: Api<NodeReport> = Api::all(lab.client.clone());
    let r = reports.get_opt(&worker.name).await?;
    ensure!(
        r.as_ref()
            .and_then(|r| r.spec.facts.reboot.as_ref())
            .is_some_and(|r| !r.required && r.reasons.is_empty()),
        "the report clears: {:?}",
        r.map(|r| r.spec.facts.reboot)
    );
    cleanup(&lab).await?;
    op.finish().await
}
