//! Node facts end to end: agents report what they find on their node in NodeTask status
//! (`status.nodeFacts.before` when they start working on a task, `.after` once it
//! finished), checked against the lab itself — the Node's kubelet version, the node's own
//! kubeadm binary, its os-release, the running kernel, and every certificate file of its
//! kubeadm PKI read with openssl — and shown by `kubectl-bosun status`.
//!
//! Build the binaries first: `cargo build -p bosun-controller -p bosun-agent -p kubectl-bosun`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use bosun_api::node_task::{KUBERNETES_PACKAGES, NodeFacts, NodeTaskPhase, upstream_version};
use bosun_api::operation::OperationPhase;
use bosun_e2e::Operator;
use bosun_lab::{LabNode, Role};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams};
use serde_json::json;

/// Every `*.crt` under the node's `pki` and `pki/etcd` (named as kubeadm names them) with
/// its notAfter, as openssl reads it.
fn certificates_by_openssl(root: &Path) -> Result<BTreeMap<String, Timestamp>> {
    let mut out = BTreeMap::new();
    for (dir, prefix) in [
        ("etc/kubernetes/pki", ""),
        ("etc/kubernetes/pki/etcd", "etcd-"),
    ] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for entry in entries {
            let path = entry?.path();
            if !path.is_file() || path.extension().is_none_or(|e| e != "crt") {
                continue;
            }
            let out_ = Command::new("openssl")
                .args(["x509", "-enddate", "-noout", "-dateopt", "iso_8601", "-in"])
                .arg(&path)
                .output()?;
            ensure!(
                out_.status.success(),
                "openssl could not read {}",
                path.display()
            );
            // `notAfter=2027-11-30 03:21:47Z`
            let text = String::from_utf8(out_.stdout)?;
            let date = text
                .trim()
                .strip_prefix("notAfter=")
                .context("openssl printed no notAfter")?
                .replacen(' ', "T", 1);
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .context("file name")?;
            out.insert(
                format!("{prefix}{stem}"),
                date.parse::<Timestamp>()
                    .with_context(|| format!("parsing {date}"))?,
            );
        }
    }
    Ok(out)
}

/// The installed Kubernetes packages of the dpkg database under `root`, as this machine's
/// `dpkg-query` reads it (`--admindir`), in the order the facts list them; empty without a
/// database (the lab's roots have none: docs/lab.md).
fn packages_by_dpkg_query(root: &Path) -> Result<Vec<(String, String)>> {
    let admindir = root.join("var/lib/dpkg");
    if !admindir.join("status").is_file() {
        return Ok(Vec::new());
    }
    let out = Command::new("dpkg-query")
        .arg(format!("--admindir={}", admindir.display()))
        .args(["-W", "-f=${Package} ${Version} ${db:Status-Status}\n"])
        .args(KUBERNETES_PACKAGES)
        .output()
        .context("running dpkg-query on the node's database")?;
    // dpkg-query exits 1 when a named package is unknown; the found ones are printed.
    let text = String::from_utf8(out.stdout)?;
    let mut found: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let (name, version, state) = (f.next()?, f.next()?, f.next()?);
            (state == "installed" && !version.is_empty())
                .then(|| (name.to_owned(), version.to_owned()))
        })
        .collect();
    found.sort_by_key(|(n, _)| KUBERNETES_PACKAGES.iter().position(|k| k == n));
    Ok(found)
}

/// The kubectl version of the node under `root`: its installed package's (as the facts
/// prefer), else what its `/usr/bin/kubectl version --client` prints; `None` without one.
fn kubectl_by_itself(root: &Path, packages: &[(String, String)]) -> Result<Option<String>> {
    if let Some((_, v)) = packages.iter().find(|(n, _)| n == "kubectl") {
        return Ok(upstream_version(v));
    }
    let kubectl = root.join("usr/bin/kubectl");
    if !kubectl.exists() {
        return Ok(None);
    }
    let out = Command::new(&kubectl)
        .args(["version", "--client", "-o", "json"])
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("{} version --client -o json", kubectl.display()))?;
    Ok(v["clientVersion"]["gitVersion"].as_str().map(str::to_owned))
}

/// The facts of `node` as the lab and this machine know them.
fn check_facts(facts: &NodeFacts, node: &LabNode, kubelet: &str, kernel: &str) -> Result<()> {
    let kubeadm = Command::new(node.host_root.join("usr/bin/kubeadm"))
        .args(["version", "-o", "short"])
        .output()?;
    let kubeadm = String::from_utf8(kubeadm.stdout)?.trim().to_owned();
    ensure!(
        !kubeadm.is_empty(),
        "the lab node's kubeadm printed no version"
    );
    ensure!(
        facts.kubelet_version.as_deref() == Some(kubelet),
        "{}: kubelet {:?}, the Node says {kubelet}",
        node.name,
        facts.kubelet_version
    );
    ensure!(
        facts.kubeadm_version.as_deref() == Some(kubeadm.as_str()),
        "{}: kubeadm {:?}, the binary says {kubeadm}",
        node.name,
        facts.kubeadm_version
    );
    // kubectl and the packages: as the node's own files say, and absent where the node
    // has none (the lab's roots have neither kubectl nor a package database).
    let packages = packages_by_dpkg_query(&node.host_root)?;
    let reported: Vec<(String, String)> = facts
        .packages
        .iter()
        .map(|p| (p.name.clone(), p.version.clone()))
        .collect();
    ensure!(
        reported == packages,
        "{}: packages {reported:?}, dpkg-query says {packages:?}",
        node.name
    );
    let kubectl = kubectl_by_itself(&node.host_root, &packages)?;
    ensure!(
        facts.kubectl_version == kubectl,
        "{}: kubectl {:?}, the node's own says {kubectl:?}",
        node.name,
        facts.kubectl_version
    );
    ensure!(
        facts.os.as_deref() == Some(node.os.as_str()),
        "{}: os {:?}, os-release says {}",
        node.name,
        facts.os,
        node.os
    );
    ensure!(
        facts.kernel.as_deref() == Some(kernel),
        "{}: kernel {:?}, uname says {kernel}",
        node.name,
        facts.kernel
    );
    ensure!(
        facts.arch.as_deref().is_some_and(|a| !a.is_empty()),
        "{}: no arch",
        node.name
    );
    let want = certificates_by_openssl(&node.host_root)?;
    ensure!(
        want.len() <= 32 && facts.certificates_omitted == 0,
        "{}: more certificates than the cap",
        node.name
    );
    let got: BTreeMap<String, Timestamp> = facts
        .certificates
        .iter()
        .map(|c| (c.name.clone(), c.not_after.0))
        .collect();
    ensure!(
        got == want,
        "{}: certificates reported {got:?}, openssl reads {want:?}",
        node.name
    );
    ensure!(
        facts
            .certificates
            .windows(2)
            .all(|w| w[0].not_after.0 <= w[1].not_after.0),
        "{}: certificates not soonest first: {:?}",
        node.name,
        facts.certificates
    );
    Ok(())
}

/// A custom Operation greeting the control plane and one worker: each task carries the
/// node's facts from before and after the task, equal to what the lab holds, and
/// `kubectl-bosun status` shows them in one line per node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_report_node_facts_before_and_after_each_task_and_status_shows_them() -> Result<()> {
    let lab = bosun_lab::ensure_lab().await?;
    let _nodes = bosun_e2e::lock_lab_nodes().await;
    bosun_e2e::apply_crds(&lab.client).await?;
    bosun_e2e::cluster::publish_hello(&lab).await?;
    let mut operator = Operator::start(&lab, "facts")?;
    let cp = lab
        .nodes
        .iter()
        .find(|n| n.role == Role::ControlPlane)
        .context("no control-plane node")?;
    let worker = lab
        .nodes
        .iter()
        .find(|n| n.role == Role::Worker)
        .context("no worker node")?;
    let selector = |n: &str| json!({ "matchExpressions": [{ "key": "kubernetes.io/hostname", "operator": "In", "values": [n] }] });
    let greet = json!([{ "name": "greet", "plugin": "hello", "action": "greet", "params": { "name": "facts" } }]);
    let name = operator
        .create_operation(
            "facts",
            json!({ "custom": { "groups": [
            { "name": "control-plane", "nodeSelector": selector(&cp.name), "steps": greet },
            { "name": "worker", "nodeSelector": selector(&worker.name), "steps": greet } ] } }),
        )
        .await?;
    let result: Result<()> = async {
        let op = operator.wait_settled(&name).await?;
        let phase = op.status.as_ref().map(|s| s.phase).unwrap_or_default();
        ensure!(
            phase == OperationPhase::Succeeded,
            "the Operation ended {phase:?}\n{}",
            bosun_e2e::describe_tasks(&lab.client, &name).await
        );

        let nodes: Api<Node> = Api::all(lab.client.clone());
        let kernel = String::from_utf8(Command::new("uname").arg("-r").output()?.stdout)?
            .trim()
            .to_owned();
        for node in [cp, worker] {
            let kubelet = nodes
                .get(&node.name)
                .await?
                .status
                .and_then(|s| s.node_info)
                .map(|i| i.kubelet_version)
                .context("the Node reports no kubelet version")?;
            // `after` is written by the agent once it sees the task finished.
            let task = operator
                .wait_task(&name, &node.name, "nodeFacts.after", |t| {
                    t.status
                        .as_ref()
                        .and_then(|s| s.node_facts.as_ref())
                        .is_some_and(|f| f.after.is_some())
                })
                .await?;
            let status = task.status.clone().unwrap_or_default();
            ensure!(
                status.phase == NodeTaskPhase::Succeeded,
                "{:?}",
                status.message
            );
            let report = status.node_facts.clone().unwrap_or_default();
            let before = report.before.context("no nodeFacts.before")?;
            let after = report.after.context("no nodeFacts.after")?;
            let step = status
                .steps
                .iter()
                .find(|s| s.name == "greet")
                .context("no greet status")?;
            let (started, finished) = (
                step.started_at.clone().context("no start")?.0,
                step.finished_at.clone().context("no finish")?.0,
            );
            ensure!(
                before.collected_at.0 <= started,
                "{}: before collected at {} after the step started at {started}",
                node.name,
                before.collected_at.0
            );
            ensure!(
                after.collected_at.0 >= finished,
                "{}: after collected at {} before the step finished at {finished}",
                node.name,
                after.collected_at.0
            );
            check_facts(&before, node, &kubelet, &kernel)?;
            check_facts(&after, node, &kubelet, &kernel)?;
            if node.role == Role::ControlPlane {
                ensure!(
                    after.certificates.iter().any(|c| c.name == "apiserver"),
                    "no apiserver certificate on {}",
                    node.name
                );
                ensure!(
                    after.certificates.iter().any(|c| c.name == "etcd-server"),
                    "no etcd-server certificate on {}",
                    node.name
                );
            }
        }

        // kubectl-bosun status: one line of facts under each node.
        let out = Command::new(bosun_e2e::binary("kubectl-bosun")?)
            .args(["status", &name, "--kubeconfig"])
            .arg(&lab.kubeconfig)
            .env("NO_COLOR", "1")
            .env_remove("KUBECONFIG")
            .output()?;
        let text = String::from_utf8(out.stdout)?;
        ensure!(
            out.status.success(),
            "kubectl-bosun status failed: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cp_task = operator.task(&name, &cp.name).await?;
        let facts = cp_task
            .status
            .and_then(|s| s.node_facts)
            .and_then(|f| f.after)
            .context("no facts")?;
        let earliest = facts
            .certificates
            .first()
            .context("no certificate on the control plane")?;
        let line = format!(
            "kubelet {} · kubeadm {} · certs expire in ",
            facts.kubelet_version.as_deref().unwrap_or("?"),
            facts.kubeadm_version.as_deref().unwrap_or("?")
        );
        ensure!(
            text.contains(&line) && text.contains(&format!("(earliest: {})", earliest.name)),
            "status shows no facts line {line:?}:\n{text}"
        );
        println!("{text}");
        Ok(())
    }
    .await;
    let ops: Api<bosun_api::operation::Operation> = Api::all(lab.client.clone());
    if let Err(e) = ops.delete(&name, &DeleteParams::background()).await {
        eprintln!("cleaning up Operation {name}: {e}");
    }
    result?;
    operator.procs.check_alive()?;
    operator.finish().await?;
    Ok(())
}
