//! End to end: an `upgrade` Operation in DryRun over every lab node (one control plane,
//! three workers; Debian, Rocky, Ubuntu and Alma roots), run by the real controller and
//! agents with the four first-party plugins the upgrade uses, signed and published with
//! the grants of deploy/examples/plugins (packages, kubeadm-upgrade, kubelet, etcd), as a user
//! would. It proves:
//! - the whole upgrade path gets through every node: the Operation and every NodeTask end
//!   Succeeded, and a step that blocks fails the test with every task's status;
//! - every step says what it would do ("would …"), including what the packages steps
//!   would install on each node's own package manager (apt or dnf, chosen by os-release),
//!   and changes nothing (`changed: false`); the control plane's etcd health check (which
//!   reads in a dry run too) passes against a simulated etcdctl, and its snapshot step says
//!   where it would save the snapshot;
//! - the node roots are unchanged, byte for byte (every file hashed before and after).
//!
//! The lab's roots have no package manager, so each gets a simulated one of its family
//! that answers the plugin's queries from a small database (kubeadm, kubelet and kubectl
//! at the lab's v1.34.4, held; v1.34.5 available) and refuses every change. The agents run
//! with `--service-backend=simulated`: the lab has no systemd.

use anyhow::{Context, Result, ensure};
use bosun_api::node_task::{NodeTaskPhase, StepPhase};
use bosun_e2e::Operator;
use bosun_plugins_tests::{
    example_grants, package_family, plugins, simulated_etcd, simulated_package_manager,
};
use serde_json::json;

const TARGET: &str = "v1.34.5";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_upgrade_succeeds_on_every_node_saying_what_it_would_do_and_changes_nothing()
-> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    bosun_e2e::apply_crds(&lab.client).await?;
    ensure!(
        lab.nodes.len() >= 2,
        "the lab has fewer than 2 nodes: {:?}",
        lab.nodes
    );

    let available: &[&str] = &["1.34.5", "1.34.4"];
    for node in &lab.nodes {
        simulated_package_manager(
            &node.host_root,
            &[
                ("kubeadm", "1.34.4", true, available),
                ("kubelet", "1.34.4", true, available),
                ("kubectl", "1.34.4", true, available),
            ],
        );
    }
    // Each control plane's etcd, as etcdctl and etcdutl would show it (the lab's nodes run
    // no etcd of their own), and the snapshot directory an administrator creates. The lab's
    // own etcd certificates and kubeadm's etcd manifest are kept; what is added is removed
    // again when the guards drop, at the end of the test (the lab's roots are shared).
    let control_planes: Vec<String> = lab
        .nodes
        .iter()
        .filter(|n| n.role == bosun_lab::Role::ControlPlane)
        .map(|n| format!("{}@127.0.0.1", n.name))
        .collect();
    let members: Vec<&str> = control_planes.iter().map(String::as_str).collect();
    let mut etcd_guards = Vec::new();
    for node in lab
        .nodes
        .iter()
        .filter(|n| n.role == bosun_lab::Role::ControlPlane)
    {
        let mut guard = simulated_etcd(&node.host_root, &members, &[]);
        guard.snapshot_dir();
        etcd_guards.push(guard);
    }
    let families: std::collections::BTreeSet<&str> = lab
        .nodes
        .iter()
        .map(|n| package_family(&n.host_root))
        .collect();
    ensure!(
        families.len() == 2,
        "the lab's roots should mix apt and dnf families, found {families:?}"
    );

    let version = env!("CARGO_PKG_VERSION");
    let p = plugins();
    for (name, bytes, file) in [
        ("packages", &p.packages, "packages.yaml"),
        (
            "kubeadm-upgrade",
            &p.kubeadm_upgrade,
            "kubeadm-upgrade.yaml",
        ),
        ("kubelet", &p.kubelet, "kubelet.yaml"),
        ("etcd", &p.etcd, "etcd.yaml"),
    ] {
        bosun_e2e::publish_plugin(
            &lab.client,
            name,
            version,
            bytes.clone(),
            serde_json::to_value(example_grants(file))?,
        )
        .await?;
    }

    let before: Vec<_> = lab
        .nodes
        .iter()
        .map(|n| bosun_e2e::operator::hash_tree(&n.host_root))
        .collect::<Result<_>>()?;

    let mut operator = Operator::start_with_agent_args(
        &lab,
        "upgrade-dry",
        &["--service-backend".into(), "simulated".into()],
    )?;
    let name = operator
        .create_operation(
            "upgrade-dry",
            json!({
                "upgrade": { "kubernetesVersion": TARGET, "packages": ["kubeadm", "kubelet", "kubectl"] },
                "executionMode": "DryRun",
                "rollout": { "maxUnavailable": 3 },
            }),
        )
        .await?;
    operator.wait_succeeded(&name).await?;

    let tasks = operator.tasks(&name).await?;
    ensure!(
        tasks.len() == lab.nodes.len(),
        "one NodeTask per node expected, found {:?}",
        tasks.keys()
    );
    for node in &lab.nodes {
        let ts = tasks[&node.name].status.clone().unwrap_or_default();
        ensure!(
            ts.phase == NodeTaskPhase::Succeeded,
            "{}: {:?} {:?}",
            node.name,
            ts.phase,
            ts.message
        );
        let names: Vec<&str> = ts.steps.iter().map(|s| s.name.as_str()).collect();
        for step in [
            "cordon",
            "drain",
            "upgrade-kubeadm",
            "kubeadm-upgrade",
            "upgrade-kubelet",
            "restart-kubelet",
            "wait-node-ready",
            "uncordon",
        ] {
            ensure!(
                names.contains(&step),
                "{}: no {step} step in {names:?}",
                node.name
            );
        }
        if node.role == bosun_lab::Role::ControlPlane {
            ensure!(
                names[..2] == ["etcd-health", "etcd-snapshot"],
                "{}: the etcd steps come first on the first control plane: {names:?}",
                node.name
            );
        } else {
            ensure!(names[0] == "cordon", "{}: {names:?}", node.name);
        }
        for s in &ts.steps {
            let message = s.message.clone().unwrap_or_default();
            println!("{} {}: {message}", node.name, s.name);
            ensure!(
                s.phase == StepPhase::Succeeded,
                "{} {}: {:?} {message}",
                node.name,
                s.name,
                s.phase
            );
            // The etcd health check reads in a dry run too, and says what it found.
            let health = format!("etcd is healthy: {} member", members.len());
            ensure!(
                message.contains("would ")
                    || (s.name == "etcd-health" && message.starts_with(&health)),
                "{} {}: no \"would …\" in {message:?}",
                node.name,
                s.name
            );
            ensure!(
                s.changed != Some(true),
                "{} {}: reports a change in a dry run",
                node.name,
                s.name
            );
        }
        let step = |n: &str| {
            ts.steps
                .iter()
                .find(|s| s.name == n)
                .and_then(|s| s.message.clone())
                .unwrap_or_default()
        };
        // What each node's own package manager would do.
        let (backend, release) = if package_family(&node.host_root) == "apt" {
            ("apt", "-1.1")
        } else {
            ("dnf", "-150500.1.1")
        };
        let kubeadm = step("upgrade-kubeadm");
        ensure!(
            kubeadm
                == format!(
                    "would install kubeadm 1.34.4{release} → 1.34.5{release} with {backend}"
                ),
            "{}: {kubeadm}",
            node.name
        );
        let kubelet = step("upgrade-kubelet");
        ensure!(
            kubelet.contains(&format!("kubelet 1.34.4{release} → 1.34.5{release}"))
                && kubelet.contains(&format!("kubectl 1.34.4{release} → 1.34.5{release}")),
            "{}: {kubelet}",
            node.name
        );
        let upgrade = step("kubeadm-upgrade");
        let command = if node.role == bosun_lab::Role::ControlPlane {
            format!("kubeadm upgrade apply --yes {TARGET}")
        } else {
            "kubeadm upgrade node".to_owned()
        };
        ensure!(
            upgrade.contains(&format!("would run `{command}`")),
            "{}: {upgrade}",
            node.name
        );
        ensure!(
            step("restart-kubelet").starts_with("would restart kubelet.service"),
            "{}",
            node.name
        );
    }

    for (node, before) in lab.nodes.iter().zip(before) {
        let after = bosun_e2e::operator::hash_tree(&node.host_root)
            .with_context(|| format!("hashing {}", node.host_root.display()))?;
        let changed: Vec<_> = before
            .iter()
            .filter(|(path, digest)| after.get(*path) != Some(digest))
            .map(|(path, _)| path.display().to_string())
            .chain(
                after
                    .keys()
                    .filter(|p| !before.contains_key(*p))
                    .map(|p| format!("{} (new)", p.display())),
            )
            .collect();
        ensure!(
            changed.is_empty(),
            "{}: a dry run changed {changed:?}",
            node.name
        );
    }
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}
