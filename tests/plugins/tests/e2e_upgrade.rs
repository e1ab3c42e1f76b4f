//! End to end, the node-lifecycle Operations with the first-party plugins: an `upgrade`
//! in DryRun, and a `reboot` (at the end of this file).
//!
//! The upgrade: an `upgrade` Operation in DryRun over every lab node (one control plane,
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
//! - the node roots are unchanged, byte for byte (every file hashed before and after);
//! - backends per OS family: the last rpm-family worker says it is openSUSE Leap
//!   (its os-release rewritten for the test, with a zypper lock file and a stand-in for the
//!   zypper program, which no dry run starts). The community zypper plugin
//!   (plugins/community/zypper), published with the grants of its own manifest and
//!   `spec.backend {for: packages, osFamilies: [opensuse-leap, ...]}`, is signed by its own
//!   publisher's key: the agents trust that key (one more `--trust-root`), and a
//!   trusted-publishers Policy (the shipped policies/trusted-publishers module) allows it
//!   for `zypper` only. That node's packages steps are run by zypper and say so; every
//!   other node's by the first-party `packages`.
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
use kube::ResourceExt;
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
    let suse = SuseNode::new(
        lab.nodes
            .iter()
            .rev()
            .find(|n| n.role == bosun_lab::Role::Worker && package_family(&n.host_root) == "dnf")
            .context("the lab has no rpm-family worker to make an openSUSE node of")?,
    )?;
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

    let community = Community::publish(&lab).await?;

    let before: Vec<_> = lab
        .nodes
        .iter()
        .map(|n| bosun_e2e::operator::hash_tree(&n.host_root))
        .collect::<Result<_>>()?;

    let mut operator = Operator::start_with_agent_args(
        &lab,
        "upgrade-dry",
        &[
            "--service-backend".into(),
            "simulated".into(),
            "--trust-root".into(),
            community.public_key.display().to_string(),
        ],
    )?;
    // The Policy before the Operation: an agent lists the Policies of its instance before
    // each step, so the first step already sees it.
    community.trust(&lab, &operator.instance).await?;
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
        let kubelet = step("upgrade-kubelet");
        if node.name == suse.name {
            // The community backend, chosen by this node's os-release; the message says so.
            let by_zypper = "(run by Plugin zypper, the backend for `packages` steps on OS family opensuse-leap)";
            ensure!(
                kubeadm
                    == format!(
                        "would refresh the repositories and install the newest 1.34.5-* of kubeadm with \
                         zypper, locked (now kubeadm 1.34.4{release}) {by_zypper}"
                    ),
                "{}: {kubeadm}",
                node.name
            );
            ensure!(
                kubelet.contains("install the newest 1.34.5-* of kubelet, kubectl with zypper")
                    && kubelet.ends_with(by_zypper),
                "{}: {kubelet}",
                node.name
            );
        } else {
            ensure!(
                kubeadm
                    == format!(
                        "would install kubeadm 1.34.4{release} → 1.34.5{release} with {backend}"
                    ),
                "{}: {kubeadm}",
                node.name
            );
            ensure!(
                kubelet.contains(&format!("kubelet 1.34.4{release} → 1.34.5{release}"))
                    && kubelet.contains(&format!("kubectl 1.34.4{release} → 1.34.5{release}"))
                    && !kubelet.contains("run by Plugin"),
                "{}: {kubelet}",
                node.name
            );
        }
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
    // Every agent judged its steps with the trusted-publishers Policy.
    for node in &lab.nodes {
        let log = std::fs::read_to_string(
            operator
                .procs
                .log_of(&bosun_e2e::operator::agent_name(&node.name)),
        )?;
        ensure!(
            log.contains("policies=1 healthy=true"),
            "{}'s agent did not compile the trusted-publishers Policy",
            node.name
        );
    }
    operator.procs.check_alive()?;
    operator.finish().await?;
    community.withdraw(&lab).await?;
    drop(suse);
    Ok(())
}

/// A lab worker made to say it is openSUSE Leap for one test: its os-release, a zypper lock
/// file holding the three packages (held, as the simulated package database has them), and
/// a stand-in for `/usr/bin/zypper` that refuses everything (the host checks that a granted
/// command exists; a dry run never starts zypper). Put back as it was when dropped.
struct SuseNode {
    name: String,
    root: std::path::PathBuf,
    os_release: Vec<u8>,
}

impl SuseNode {
    fn new(node: &bosun_lab::LabNode) -> Result<SuseNode> {
        let root = node.host_root.clone();
        let os_release = std::fs::read(root.join("etc/os-release"))
            .with_context(|| format!("reading {}'s os-release", node.name))?;
        let guard = SuseNode {
            name: node.name.clone(),
            root,
            os_release,
        };
        let write = |rel: &str, text: &str| {
            bosun_plugins_tests::write(&guard.root, rel, text);
        };
        write(
            "etc/os-release",
            "NAME=\"openSUSE Leap\"\nVERSION=\"15.6\"\nID=\"opensuse-leap\"\nID_LIKE=\"suse opensuse\"\nVERSION_ID=\"15.6\"\nPRETTY_NAME=\"openSUSE Leap 15.6\"\n",
        );
        let locks: String = ["kubeadm", "kubelet", "kubectl"]
            .iter()
            .map(|p| {
                format!(
                    "type: package\nmatch_type: glob\ncase_sensitive: on\nsolvable_name: {p}\n\n"
                )
            })
            .collect();
        write("etc/zypp/locks", &locks);
        write(
            "usr/bin/zypper",
            "#!/bin/sh\necho \"zypper (a stand-in in this test) runs nothing: $*\" >&2\nexit 100\n",
        );
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(
            guard.root.join("usr/bin/zypper"),
            std::fs::Permissions::from_mode(0o755),
        )?;
        Ok(guard)
    }
}

impl Drop for SuseNode {
    fn drop(&mut self) {
        let _ = std::fs::write(self.root.join("etc/os-release"), &self.os_release);
        let _ = std::fs::remove_dir_all(self.root.join("etc/zypp"));
        let _ = std::fs::remove_file(self.root.join("usr/bin/zypper"));
    }
}

/// The community zypper plugin in the cluster: published with its manifest's grants and
/// backend claim, signed by a key of its own publisher (not the e2e key the other plugins
/// carry), and a trusted-publishers Policy allowing the e2e key for every plugin and that
/// key for `zypper` only.
struct Community {
    /// Holds the public key file; removed when dropped.
    _keys: tempfile::TempDir,
    public_key: std::path::PathBuf,
    /// The community key's id, as policies name it.
    key_id: String,
}

const TRUSTED_PUBLISHERS: &str = "e2e-trusted-publishers";

impl Community {
    async fn publish(lab: &bosun_lab::LabHandle) -> Result<Community> {
        use bosun_api::plugin::Plugin;
        use bosun_trust::{Digest, SigningKey, Statement};
        use kube::api::{Api, PostParams};

        let key = SigningKey::generate_ed25519();
        let keys = tempfile::Builder::new().prefix("community-").tempdir()?;
        let public_key = keys.path().join("community.pub");
        std::fs::write(&public_key, key.public_key().to_pem())?;

        let manifest =
            bosun_plugins_tests::workspace_root().join("plugins/community/zypper/zypper.yaml");
        let bytes = plugins().zypper.clone();
        bosun_e2e::publish_plugin(
            &lab.client,
            "zypper",
            "0.1.0",
            bytes.clone(),
            serde_json::to_value(bosun_plugins_tests::grants_of(&manifest))?,
        )
        .await?;
        let api: Api<Plugin> = Api::all(lab.client.clone());
        let mut plugin = api.get("zypper").await.context("reading Plugin zypper")?;
        let signature = key.sign_statement(&Statement::new("zypper", "0.1.0", Digest::of(&bytes))?);
        plugin.spec.signatures = serde_json::from_value(json!([{
            "algorithm": "ed25519", "keyId": signature.key_id, "signature": signature.signature,
        }]))?;
        plugin.spec.backend = serde_json::from_value(json!({
            "for": "packages",
            "osFamilies": ["opensuse-leap", "opensuse-tumbleweed", "sles", "suse"],
        }))?;
        api.replace("zypper", &PostParams::default(), &plugin)
            .await
            .context("signing Plugin zypper with the community key and claiming packages")?;

        Ok(Community {
            _keys: keys,
            public_key,
            key_id: format!("{:#}", key.public_key().key_id()),
        })
    }

    /// Creates the trusted-publishers Policy for the agents of `instance` (they read the
    /// Policies labelled with it): the e2e key for every plugin, this key for `zypper` only.
    async fn trust(&self, lab: &bosun_lab::LabHandle, instance: &str) -> Result<()> {
        use bosun_api::policy::Policy;
        use kube::api::{Api, PostParams};
        let rego = std::fs::read_to_string(
            bosun_plugins_tests::workspace_root().join("policies/trusted-publishers/policy.rego"),
        )?;
        let (e2e, _) = bosun_e2e::cluster::signing_key()?;
        let policy: Policy = serde_json::from_value(json!({
            "apiVersion": "bosun.dev/v1alpha1",
            "kind": "Policy",
            "metadata": {
                "name": TRUSTED_PUBLISHERS,
                "labels": { bosun_e2e::operator::INSTANCE_LABEL: instance },
            },
            "spec": {
                "rego": rego,
                "data": { "trusted_publishers": {
                    "signers": [format!("{:#}", e2e.public_key().key_id())],
                    "plugins": { "zypper": [self.key_id.clone()] },
                } },
            },
        }))?;
        let policies: Api<Policy> = Api::all(lab.client.clone());
        let _ = policies
            .delete(TRUSTED_PUBLISHERS, &Default::default())
            .await;
        policies
            .create(&PostParams::default(), &policy)
            .await
            .context("creating the trusted-publishers Policy")?;
        Ok(())
    }

    /// Deletes the Policy and the Plugin again (the lab is shared).
    async fn withdraw(self, lab: &bosun_lab::LabHandle) -> Result<()> {
        use kube::api::Api;
        Api::<bosun_api::policy::Policy>::all(lab.client.clone())
            .delete(TRUSTED_PUBLISHERS, &Default::default())
            .await
            .context("deleting the trusted-publishers Policy")?;
        Api::<bosun_api::plugin::Plugin>::all(lab.client.clone())
            .delete("zypper", &Default::default())
            .await
            .context("deleting Plugin zypper")?;
        Ok(())
    }
}

/// The lab's simulated nodes share one kernel and one init, so a "reboot" there is a new
/// line in the agents' boot-identity file (`--boot-identity-file`) and a restart of the
/// node's agent: what a real reboot looks like to the agent that comes back.
fn reboot_lab_node(
    operator: &mut Operator,
    node: &str,
    boot_file: &std::path::Path,
    boot: &str,
) -> Result<()> {
    use std::io::Write as _;
    operator.kill(&bosun_e2e::operator::agent_name(node))?;
    let mut f = std::fs::OpenOptions::new().append(true).open(boot_file)?;
    writeln!(f, "{boot}")?;
    operator.start_agent(node)
}

fn reboot_step(task: &bosun_api::node_task::NodeTask) -> Option<bosun_api::node_task::StepStatus> {
    task.status
        .as_ref()
        .and_then(|s| s.steps.iter().find(|x| x.name == "reboot").cloned())
}

/// A reboot, on one lab worker:
/// 1. A step that reboots the node and whose node does not come back in time blocks the task
///    as StepTimedOut, with a message naming the node, the deadline and what to check (a
///    custom Operation's `awaitNewBoot` step, with a 15 s step timeout). A new boot that
///    comes after the block changes nothing; a person's skip ends it.
/// 2. A `reboot` Operation: cordon, drain, the `reboot` plugin asks for the reboot (the
///    simulated systemd records the start of reboot.target), and the step stays Running
///    with the boot identity it started in; the other nodes get no task. The node's agent
///    "reboots" (a new boot identity, a restart): the new agent finishes the step without
///    running the plugin again, the node must be Ready, it is uncordoned, and the Operation
///    succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reboot_finishes_with_the_nodes_new_boot_and_blocks_when_it_does_not_come() -> Result<()>
{
    use bosun_api::node_task::BlockReason;
    use k8s_openapi::api::core::v1::Node;
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    bosun_e2e::apply_crds(&lab.client).await?;
    let worker = lab
        .nodes
        .iter()
        .find(|n| n.role == bosun_lab::Role::Worker)
        .context("the lab has a worker")?
        .name
        .clone();
    bosun_e2e::publish_plugin(
        &lab.client,
        "reboot",
        env!("CARGO_PKG_VERSION"),
        plugins().reboot.clone(),
        serde_json::to_value(example_grants("reboot.yaml"))?,
    )
    .await?;
    let boot_file = bosun_e2e::target_dir().join(format!("{}.boot", bosun_e2e::unique("reboot")));
    std::fs::write(&boot_file, "lab-boot-1\n")?;
    let mut operator = Operator::start_with_agent_args(
        &lab,
        "reboot",
        &[
            "--service-backend".into(),
            "simulated".into(),
            "--boot-identity-file".into(),
            boot_file.display().to_string(),
        ],
    )?;
    let on_worker = json!({ "matchLabels": { "kubernetes.io/hostname": worker } });

    // 1. The node does not come back within the step's timeout.
    let late = operator
        .create_operation(
            "reboot-late",
            json!({
                "custom": { "groups": [{ "name": "reboot", "steps": [
                    { "name": "reboot", "plugin": "reboot", "action": "reboot", "awaitNewBoot": true },
                ] }] },
                "nodeSelector": on_worker,
                "stepTimeoutSeconds": 15,
            }),
        )
        .await?;
    let blocked = operator
        .wait_task(&late, &worker, "Blocked", |t| {
            t.status
                .as_ref()
                .is_some_and(|s| s.phase == NodeTaskPhase::Blocked)
        })
        .await?;
    let status = blocked.status.clone().unwrap_or_default();
    let message = status.message.clone().unwrap_or_default();
    println!("{message}");
    ensure!(
        status.reason == Some(BlockReason::StepTimedOut),
        "{status:?}"
    );
    for part in [
        format!(
            "node {worker} is not back with a new boot 15s (stepTimeoutSeconds) after step reboot started"
        ),
        "the reboot was asked for at".to_owned(),
        "journalctl -u kubelet".to_owned(),
        "retry (the step asks for the reboot again) or skip".to_owned(),
    ] {
        ensure!(message.contains(&part), "{part:?} not in {message}");
    }
    let step = reboot_step(&blocked).context("the reboot step's entry")?;
    ensure!(
        (step.phase, step.attempts, step.boot_id.as_deref())
            == (StepPhase::Failed, 1, Some("lab-boot-1"))
            && step.reboot_requested_at.is_some()
            && step
                .error
                .as_ref()
                .is_some_and(|e| e.code == "boot-timeout"),
        "{step:?}"
    );
    // The new boot comes after the block: the task stays as the person will find it.
    reboot_lab_node(&mut operator, &worker, &boot_file, "lab-boot-2")?;
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let still = operator.task(&late, &worker).await?;
    ensure!(
        still.status.as_ref().map(|s| s.phase) == Some(NodeTaskPhase::Blocked)
            && reboot_step(&still).map(|s| s.phase) == Some(StepPhase::Failed),
        "a new boot after the block changed the task: {:?}",
        still.status
    );
    operator
        .patch_task_spec(&still.name_any(), json!({ "recovery": "Skip" }))
        .await?;
    operator.wait_settled(&late).await?;

    // 2. A reboot Operation, and the node comes back.
    let name = operator
        .create_operation(
            "reboot",
            json!({ "reboot": {}, "nodeSelector": on_worker, "stepTimeoutSeconds": 600 }),
        )
        .await?;
    let waiting = operator
        .wait_task(&name, &worker, "the reboot asked for", |t| {
            reboot_step(t).is_some_and(|s| s.reboot_requested_at.is_some())
        })
        .await?;
    let step = reboot_step(&waiting).context("the reboot step's entry")?;
    println!("{}", step.message.clone().unwrap_or_default());
    ensure!(
        (step.phase, step.attempts, step.boot_id.as_deref())
            == (StepPhase::Running, 1, Some("lab-boot-2")),
        "{step:?}"
    );
    ensure!(
        step.message
            .as_deref()
            .is_some_and(|m| m.contains("reboot of ")
                && m.contains("asked for")
                && m.contains(
                    "the step finishes when the node is back with a new boot (boot lab-boot-2)"
                )),
        "{step:?}"
    );
    let nodes: kube::Api<Node> = kube::Api::all(lab.client.clone());
    let cordoned = |n: &Node| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    ensure!(
        cordoned(&nodes.get(&worker).await?),
        "{worker} is not cordoned during its reboot"
    );
    // The controller's passes and the agent's own do not move it on, or run it again.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let task = operator.task(&name, &worker).await?;
    ensure!(
        task.status.as_ref().map(|s| s.phase) == Some(NodeTaskPhase::Running)
            && reboot_step(&task).map(|s| (s.phase, s.attempts)) == Some((StepPhase::Running, 1)),
        "{:?}",
        task.status
    );

    reboot_lab_node(&mut operator, &worker, &boot_file, "lab-boot-3")?;
    operator.wait_succeeded(&name).await?;
    let tasks = operator.tasks_each_run_once(&name, 1).await?;
    let task = &tasks[&worker];
    let step = reboot_step(task).context("the reboot step's entry")?;
    println!("{}", step.message.clone().unwrap_or_default());
    ensure!(
        step.message.as_deref()
            == Some("the node is back with a new boot (lab-boot-2 → lab-boot-3)")
            && step.boot_id.as_deref() == Some("lab-boot-2")
            && step.changed == Some(true),
        "{step:?}"
    );
    let names: Vec<&str> = task
        .status
        .as_ref()
        .map(|s| s.steps.iter().map(|x| x.name.as_str()).collect())
        .unwrap_or_default();
    ensure!(
        names == ["cordon", "drain", "reboot", "wait-node-ready", "uncordon"],
        "{names:?}"
    );
    ensure!(
        !cordoned(&nodes.get(&worker).await?),
        "{worker} is still cordoned after its reboot"
    );
    // The plugin ran once for this Operation's step: one start write, and one reboot asked for.
    let log = std::fs::read_to_string(
        operator
            .procs
            .log_of(&bosun_e2e::operator::agent_name(&worker)),
    )?;
    let asked = log
        .matches("the reboot was asked for; the step waits for the node's new boot")
        .count();
    ensure!(
        asked == 2,
        "the agents' log says the reboot was asked for {asked} times, expected 2 (one per Operation)"
    );
    ensure!(log.contains("the node is back with a new boot; the step succeeded"));
    operator.finish().await?;
    std::fs::remove_file(&boot_file)?;
    Ok(())
}

/// A real Prometheus for the alert gate (tests/lab/build-prometheus.sh), on a free port of
/// 127.0.0.1, evaluating its rule file every second. Stopped when dropped.
struct LabPrometheus {
    child: std::process::Child,
    dir: std::path::PathBuf,
    url: String,
    host_port: String,
}

impl LabPrometheus {
    /// Starts Prometheus with `rules` (a rule file's YAML) and waits until it answers.
    async fn start(rules: &str) -> Result<LabPrometheus> {
        let bin = bosun_e2e::paths::go_tool_dir("build-prometheus.sh")?.join("prometheus");
        let dir = bosun_e2e::target_dir().join(bosun_e2e::unique("prometheus"));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("rules.yaml"), rules)?;
        std::fs::write(
            dir.join("prometheus.yaml"),
            "global: {evaluation_interval: 1s, scrape_interval: 1m}\nrule_files: [rules.yaml]\n",
        )?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let host_port = format!("127.0.0.1:{port}");
        let log = std::fs::File::create(dir.join("prometheus.log"))?;
        let child = std::process::Command::new(&bin)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yaml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={host_port}"))
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let me = LabPrometheus {
            child,
            dir,
            url: format!("http://{host_port}"),
            host_port,
        };
        let started = std::time::Instant::now();
        while me.alerts().await.is_err() {
            ensure!(
                started.elapsed() < std::time::Duration::from_secs(60),
                "Prometheus did not answer within 60 s; its log: {}",
                me.dir.join("prometheus.log").display()
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        Ok(me)
    }

    /// The `alertname`s and states of `/api/v1/alerts`, asked with a plain HTTP/1.0 GET.
    async fn alerts(&self) -> Result<Vec<(String, String)>> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut s = tokio::net::TcpStream::connect(&self.host_port).await?;
        s.write_all(b"GET /api/v1/alerts HTTP/1.0\r\n\r\n").await?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).await?;
        let text = String::from_utf8(raw)?;
        let body = text.split_once("\r\n\r\n").map(|b| b.1).unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(body)?;
        Ok(v["data"]["alerts"]
            .as_array()
            .context("no data.alerts")?
            .iter()
            .map(|a| {
                (
                    a["labels"]["alertname"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    a["state"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect())
    }

    /// Replaces the rule file and has Prometheus load it (SIGHUP).
    fn set_rules(&self, rules: &str) -> Result<()> {
        std::fs::write(self.dir.join("rules.yaml"), rules)?;
        let status = std::process::Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()?;
        ensure!(status.success(), "kill -HUP prometheus: {status}");
        Ok(())
    }
}

impl Drop for LabPrometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(self.dir.join("data"));
    }
}

/// A rule file with alerts that always fire, named `names`.
fn always_firing(names: &[&str]) -> String {
    let rules: Vec<String> = names
        .iter()
        .map(|n| format!("      - alert: {n}\n        expr: vector(1)\n"))
        .collect();
    format!(
        "groups:\n  - name: bosun-lab\n    rules:\n{}",
        rules.concat()
    )
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

/// The declarative reboot and its gates, with the real controller and agents and a real
/// Prometheus:
/// 1. A worker whose root gets Debian's `/run/reboot-required`; the ClusterLifecycle with
///    `reboots: {when: Required}` generates one reboot Operation for that node only, with
///    the gates copied.
/// 2. The shipped maintenance-window Policy, with no window open: the Operation is held by
///    policy (the node is not cordoned), the ClusterLifecycle says PolicyHold. A window
///    opening lets it go on by itself.
/// 3. A pod matching `blockingPodSelector` on the node holds it: the task stays Pending
///    with a `RebootGate` condition naming the pod, the Operation says so, with an Event.
///    Deleting the pod lets it go on.
/// 4. An alert firing in Prometheus holds it (an ignored one does not), naming the alert.
///    The rule gone, the node is cordoned, drained and "rebooted" (a new boot identity; the
///    sentinel gone, as a reboot clears /run), and uncordoned; the Operation succeeds and no
///    other node got a task; the ClusterLifecycle counts no reboot and is InSync.
/// 5. The node asking again for the same reason after that reboot is not rebooted again:
///    `RebootDidNotClear`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generated_reboot_waits_for_its_window_blocking_pods_and_alerts() -> Result<()> {
    use bosun_api::lifecycle::ClusterLifecycle;
    use bosun_api::operation::{Operation, OperationPhase};
    use bosun_e2e::lifecycle::{self, condition, current, wait_lifecycle, waiting_is};
    use k8s_openapi::api::core::v1::{Node, Pod};
    use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    lifecycle::reset(&lab).await?;
    let worker = lab
        .nodes
        .iter()
        .find(|n| n.role == bosun_lab::Role::Worker)
        .context("the lab has a worker")?;
    let name_of_worker = worker.name.clone();
    let run = worker.host_root.join("run");
    let (sentinel, pkgs) = (
        run.join("reboot-required"),
        run.join("reboot-required.pkgs"),
    );
    std::fs::create_dir_all(&run)?;
    let _remove = RemoveFilesOnDrop(vec![sentinel.clone(), pkgs.clone()]);
    bosun_e2e::publish_plugin(
        &lab.client,
        "reboot",
        env!("CARGO_PKG_VERSION"),
        plugins().reboot.clone(),
        serde_json::to_value(example_grants("reboot.yaml"))?,
    )
    .await?;
    let prometheus =
        LabPrometheus::start(&always_firing(&["BosunLabNodeDown", "BosunLabWatchdog"])).await?;
    let boot_file = bosun_e2e::target_dir().join(format!("{}.boot", bosun_e2e::unique("gates")));
    std::fs::write(&boot_file, "lab-boot-1\n")?;
    let mut operator = Operator::start_with_args(
        &lab,
        "reboot-gates",
        &[
            "--lifecycle".into(),
            "true".into(),
            "--prometheus-plain-http".into(),
            prometheus.host_port.clone(),
        ],
        &[
            "--node-report".into(),
            "true".into(),
            "--node-report-seconds".into(),
            "1".into(),
            "--service-backend".into(),
            "simulated".into(),
            "--boot-identity-file".into(),
            boot_file.display().to_string(),
        ],
    )?;
    let instance = operator.instance.clone();

    // The shipped maintenance-window policy, every window closed: yesterday, one minute.
    let policies: Api<bosun_api::Policy> = Api::all(lab.client.clone());
    let window = format!("{instance}-window");
    let rego = std::fs::read_to_string(
        bosun_e2e::workspace_root().join("policies/maintenance-window/policy.rego"),
    )?;
    let yesterday = (k8s_openapi::jiff::Timestamp::now()
        - k8s_openapi::jiff::SignedDuration::from_hours(24))
    .strftime("%a")
    .to_string();
    let apply_window = |windows: serde_json::Value| {
        let policies = policies.clone();
        let (window, rego, instance) = (window.clone(), rego.clone(), instance.clone());
        async move {
            policies
                .patch(
                    &window,
                    &PatchParams::apply(bosun_e2e::MANAGER).force(),
                    &Patch::Apply(json!({
                        "apiVersion": "bosun.dev/v1alpha1", "kind": "Policy",
                        "metadata": { "name": window, "labels": { "bosun.dev/instance": instance } },
                        "spec": { "enforcement": "Deny", "rego": rego,
                                  "data": { "maintenance_windows": { "timezone": "UTC", "windows": windows } } },
                    })),
                )
                .await
                .context("applying the maintenance-window Policy")
        }
    };
    apply_window(json!([{ "days": [yesterday], "start": "00:00", "end": "00:01" }])).await?;
    let started = std::time::Instant::now();
    while !policies
        .get(&window)
        .await?
        .status
        .is_some_and(|s| s.compiled)
    {
        ensure!(
            started.elapsed() < bosun_e2e::DEADLINE,
            "Policy {window} never compiled"
        );
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }

    // 1. The need, and the setting: one reboot Operation, for that node.
    std::fs::write(&pkgs, "linux-image-6.12.57+deb13-amd64\n")?;
    std::fs::write(&sentinel, "*** System restart required ***\n")?;
    let pod_label = format!("bosun-e2e-blocks-reboot-{instance}");
    let lifecycles: Api<ClusterLifecycle> = Api::all(lab.client.clone());
    wait_lifecycle(
        &mut operator,
        "adopted, counting the worker's reboot need",
        |c| current(c) && c.status.as_ref().is_some_and(|s| s.reboots.required == 1),
    )
    .await?;
    lifecycles
        .patch(
            "cluster",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "reboots": {
                "when": "Required",
                "blockingPodSelector": { "matchLabels": { "bosun.dev/e2e-blocks-reboot": pod_label } },
                "alerts": { "prometheusUrl": prometheus.url, "ignoreAlerts": "BosunLabWatch.*" },
            }}})),
        )
        .await
        .context("setting reboots.when: Required")?;
    let ops: Api<Operation> = Api::all(lab.client.clone());
    let selector = format!("bosun.dev/instance={instance},bosun.dev/lifecycle");
    let generated =
        bosun_e2e::lifecycle::wait_one_generated(&mut operator, "reboot Operation").await?;
    let name = generated.name_any();
    let reboot = generated
        .spec
        .reboot
        .clone()
        .context("not a reboot Operation")?;
    ensure!(
        name.starts_with(&format!("lifecycle-reboot-{name_of_worker}-"))
            && reboot.nodes == [name_of_worker.clone()]
            && reboot.blocking_pod_selector.is_some()
            && reboot
                .alerts
                .as_ref()
                .is_some_and(|a| a.prometheus_url == prometheus.url),
        "{name}: {reboot:?}"
    );

    // 2. No window open: held by policy, nothing cordoned.
    let held = operator
        .wait_operation(&name, "held by the maintenance window", |o| {
            o.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Blocked"
                        && c.reason == "PolicyDenied"
                        && c.message.contains("no maintenance window is open")
                        && c.message.contains(&format!("node {name_of_worker} waits"))
                })
            })
        })
        .await?;
    println!(
        "{}",
        held.status
            .clone()
            .unwrap_or_default()
            .message
            .unwrap_or_default()
    );
    let nodes: Api<Node> = Api::all(lab.client.clone());
    let cordoned = |n: &Node| n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
    ensure!(
        !cordoned(&nodes.get(&name_of_worker).await?),
        "cordoned outside the window"
    );
    let pending = operator.task(&name, &name_of_worker).await?;
    ensure!(
        pending.status.as_ref().map(|s| s.phase).unwrap_or_default() == NodeTaskPhase::Pending,
        "{:?}",
        pending.status
    );
    wait_lifecycle(&mut operator, "waiting: PolicyHold", |c| {
        waiting_is(c, "PolicyHold")
    })
    .await?;

    // 3. A blocking pod on the node (the lab has no kubelet: it stays Pending, which counts).
    let pods: Api<Pod> = Api::namespaced(lab.client.clone(), "default");
    let pod_name = format!("batch-{instance}");
    let mut pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": pod_name, "labels": { "bosun.dev/e2e-blocks-reboot": pod_label } },
        "spec": { "nodeName": name_of_worker, "containers": [{ "name": "job", "image": "registry.k8s.io/pause:3.10" }] },
    }))?;
    pod = pods.create(&PostParams::default(), &pod).await?;
    // The window opens (every day, all day): the policy lets the node go, the pod holds it.
    apply_window(json!([{ "days": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"], "start": "00:00", "end": "00:00" }])).await?;
    let gate_of = |t: &bosun_api::node_task::NodeTask| {
        t.status.as_ref().and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "RebootGate" && c.status == "True")
                .map(|c| (c.reason.clone(), c.message.clone()))
        })
    };
    let by_pod = operator
        .wait_task(&name, &name_of_worker, "held by the blocking pod", |t| {
            gate_of(t).is_some_and(|g| g.0 == "BlockingPod")
        })
        .await?;
    let (_, message) = gate_of(&by_pod).unwrap_or_default();
    println!("{message}");
    ensure!(
        message.starts_with(&format!(
            "pod default/{pod_name} on node {name_of_worker} matches spec.reboot.blockingPodSelector"
        )) && by_pod.status.as_ref().and_then(|s| s.message.clone()) == Some(message.clone()),
        "{message}"
    );
    let op_now = ops.get(&name).await?;
    let status = op_now.status.clone().unwrap_or_default();
    ensure!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.starts_with(&message))
            && status
                .conditions
                .iter()
                .any(|c| c.type_ == "RebootGate" && c.status == "True" && c.message == message),
        "the Operation says which gate holds which node: {status:?}"
    );
    let events = bosun_e2e::events_about(&lab.client, &name, Some("RebootHeld")).await?;
    ensure!(
        events
            .iter()
            .any(|e| e.note.as_deref() == Some(message.as_str())),
        "no RebootHeld Event with the message: {events:?}"
    );
    ensure!(
        !cordoned(&nodes.get(&name_of_worker).await?),
        "cordoned while a blocking pod runs"
    );
    pods.delete(
        &pod.name_any(),
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await?;

    // 4. Then the alert: NodeDown counts, the Watchdog is ignored.
    let firing = prometheus.alerts().await?;
    ensure!(
        firing
            .iter()
            .any(|(n, s)| n == "BosunLabNodeDown" && s == "firing"),
        "Prometheus reports {firing:?}"
    );
    let by_alert = operator
        .wait_task(&name, &name_of_worker, "held by the alert", |t| {
            gate_of(t).is_some_and(|g| g.0 == "AlertsFiring")
        })
        .await?;
    let (_, message) = gate_of(&by_alert).unwrap_or_default();
    println!("{message}");
    ensure!(
        message.starts_with(&format!(
            "Prometheus at {} reports alert BosunLabNodeDown (1 more ignored by ignoreAlerts): the reboot of node {name_of_worker} waits",
            prometheus.url
        )),
        "{message}"
    );
    ensure!(
        !cordoned(&nodes.get(&name_of_worker).await?),
        "cordoned while an alert fires"
    );
    prometheus.set_rules(&always_firing(&["BosunLabWatchdog"]))?;
    let asked = operator
        .wait_task(&name, &name_of_worker, "the reboot asked for", |t| {
            reboot_step(t).is_some_and(|s| s.reboot_requested_at.is_some())
        })
        .await?;
    ensure!(
        gate_of(&asked).is_none(),
        "the gate's condition stays after the start: {:?}",
        asked.status
    );
    ensure!(
        cordoned(&nodes.get(&name_of_worker).await?),
        "not cordoned during its reboot"
    );
    // The reboot: /run is cleared, the node comes back with a new boot.
    std::fs::remove_file(&sentinel)?;
    std::fs::remove_file(&pkgs)?;
    reboot_lab_node(&mut operator, &name_of_worker, &boot_file, "lab-boot-2")?;
    let done = operator.wait_succeeded(&name).await?;
    ensure!(done.status.as_ref().map(|s| s.phase) == Some(OperationPhase::Succeeded));
    let tasks = operator.tasks_each_run_once(&name, 1).await?;
    ensure!(
        tasks.keys().eq([&name_of_worker]),
        "tasks on {:?}",
        tasks.keys()
    );
    ensure!(
        !cordoned(&nodes.get(&name_of_worker).await?),
        "still cordoned after its reboot"
    );
    let gate = done
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "RebootGate"))
        .map(|c| (c.status.clone(), c.reason.clone()));
    ensure!(
        gate == Some(("False".into(), "GatesClear".into())),
        "{gate:?}"
    );
    let synced = wait_lifecycle(&mut operator, "InSync with no reboot needed", |c| {
        current(c)
            && condition(c, "InSync").as_deref() == Some("True")
            && c.status.as_ref().is_some_and(|s| s.reboots.required == 0)
    })
    .await?;
    let history = synced.status.clone().unwrap_or_default().history;
    ensure!(
        history.iter().any(|h| h.name == name && h.kind == "reboot"),
        "{history:?}"
    );

    // 5. The same need again after that reboot: not rebooted again.
    std::fs::write(&pkgs, "linux-image-6.12.57+deb13-amd64\n")?;
    std::fs::write(&sentinel, "*** System restart required ***\n")?;
    let again = wait_lifecycle(&mut operator, "waiting: RebootDidNotClear", |c| {
        waiting_is(c, "RebootDidNotClear")
    })
    .await?;
    let why = bosun_e2e::lifecycle::condition_message(&again, "Progressing");
    println!("{why}");
    ensure!(
        why.contains(&format!(
            "node {name_of_worker} was rebooted by Operation {name}"
        )) && why.contains(&format!("kubectl delete operation {name}")),
        "{why}"
    );
    let all = ops
        .list(&ListParams::default().labels(&selector))
        .await?
        .items;
    ensure!(
        all.len() == 1,
        "generated again: {:?}",
        all.iter().map(|o| o.name_any()).collect::<Vec<_>>()
    );
    std::fs::remove_file(&sentinel)?;
    std::fs::remove_file(&pkgs)?;

    policies.delete(&window, &DeleteParams::default()).await?;
    lifecycle::remove(&lab).await?;
    operator.finish().await?;
    std::fs::remove_file(&boot_file)?;
    Ok(())
}
