//! Node facts the agent reports in NodeTask status (`status.nodeFacts`): what it found on
//! its node when it started working on a task (`before`) and once its work on the task was
//! done (`after`), so an upgrade or a certificate renewal shows its effect.
//!
//! What is read, and how (one way per fact, shared with the plugins and the step gate):
//! - the kubelet's version from the Node object (`status.nodeInfo.kubeletVersion`, the
//!   value the built-in `agent/kubelet-skew` preflight check also reads);
//! - kubeadm's and kubectl's versions, the installed Kubernetes packages, os-release,
//!   architecture and kernel through [`bosun_host::Host::node_facts`], the same provider a
//!   plugin's `facts.node` call uses (it reads the versions without executing anything:
//!   the dpkg database, else the version string embedded in the node's `/usr/bin/kubeadm`
//!   and `/usr/bin/kubectl`);
//! - certificate expiry from every `*.crt` in `<host root>/etc/kubernetes/pki` and
//!   `pki/etcd`, parsed as X.509 ([`read_certificates`]; the step gate's
//!   `node.certificates` is built from the same list).
//!
//! When they are read, and which write carries them (no write of their own when a step's
//! write can carry them):
//! - `before` is read right before the task's first agent step starts, and carried by that
//!   step's start write; `after` is read right after the task's last agent step succeeded,
//!   and carried by that step's result write. Both are then owned by that step's field
//!   manager (`<manager>.step.<name>`), so every later write of that manager carries them
//!   again ([`carried`]), or server-side apply would remove them.
//! - Once the task is Succeeded or Skipped, the agent reads the facts again if it carried
//!   `after` itself, and writes `after` anew (its own manager, `<manager>.facts.after`)
//!   only if something changed since (a kubelet that reported its new version late, a
//!   certificate renewed by a controller step): `after` always says what the node held
//!   once the task's work was done, and a task that changed nothing since costs no write.
//! - A task with no agent step gets `before` when the agent first sees it Running and
//!   `after` once it finished, each in a write of its own (`<manager>.facts.before`,
//!   `<manager>.facts.after`); so does a task that finished (Skipped) without an `after`.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use bosun_api::node_task::{
    CertificateExpiry, CommandConfinement, MAX_CERTIFICATES, MAX_PACKAGES, NodeFacts, NodeTask,
    NodeTaskPhase,
};
use bosun_api::operation::RunsOn;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use bosun_cluster::time::precise;

use crate::{Agent, Error};

/// Kept for [`bosun_host::Host::node_facts`]'s signature: the host executes nothing to read
/// facts, so nothing waits this long.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Which of a task's two reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Before the task's first agent step (when the agent first sees a task with no agent
    /// step Running).
    Before,
    /// After the task's last agent step (once a task with no agent step finished).
    After,
}

impl Stage {
    fn field(self) -> &'static str {
        match self {
            Stage::Before => "before",
            Stage::After => "after",
        }
    }
}

/// What this process remembers of the reports it wrote, by task uid, for the tasks in
/// flight: the `before` it wrote, as written (the status type keeps whole seconds of
/// `collectedAt`; a later write that carries it again sends it unchanged), and which tasks
/// had their `after` carried by a step result (to be read again once the task finished).
/// Both are forgotten once the task's `after` is final, so this holds one entry per task
/// in flight.
#[derive(Debug, Default)]
pub struct Written(Mutex<WrittenInner>);

#[derive(Debug, Default)]
struct WrittenInner {
    before: HashMap<String, serde_json::Value>,
    recheck: HashSet<String>,
}

impl Written {
    fn with<T>(&self, f: impl FnOnce(&mut WrittenInner) -> T) -> T {
        let mut inner = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut inner)
    }

    /// The `before` this process wrote for task `uid`, as written.
    pub fn before(&self, uid: &str) -> Option<serde_json::Value> {
        self.with(|w| w.before.get(uid).cloned())
    }

    fn record_before(&self, uid: &str, body: serde_json::Value) {
        self.with(|w| w.before.insert(uid.to_owned(), body));
    }

    /// A step result carried task `uid`'s `after`: read the facts again once it finished.
    pub fn carried_after(&self, uid: &str) {
        self.with(|w| w.recheck.insert(uid.to_owned()));
    }

    fn recheck_due(&self, uid: &str) -> bool {
        self.with(|w| w.recheck.contains(uid))
    }

    /// Task `uid`'s `after` is final: forget the task.
    fn forget(&self, uid: &str) {
        self.with(|w| {
            w.before.remove(uid);
            w.recheck.remove(uid);
        });
    }
}

/// Whether `task` has a step its node's agent runs.
pub fn has_agent_step(task: &NodeTask) -> bool {
    task.spec.steps.iter().any(|s| s.runs_on == RunsOn::Agent)
}

/// The index of the task's first and last agent steps (spec order).
pub fn agent_steps(task: &NodeTask) -> Option<(usize, usize)> {
    let steps = &task.spec.steps;
    let first = steps.iter().position(|s| s.runs_on == RunsOn::Agent)?;
    let last = steps.iter().rposition(|s| s.runs_on == RunsOn::Agent)?;
    Some((first, last))
}

/// Which report, if any, needs a write of its own now. Pure: the phase, the steps and the
/// reports in status.
///
/// `before` is due when a task with no agent step is Running and has none (a task with
/// agent steps gets it with its first step's start); `after` when the task finished with
/// Succeeded or Skipped and has a `before` but no `after` (a task the agent never saw
/// Running gets no reports; an Invalid task's node is gone).
pub fn due(task: &NodeTask) -> Option<Stage> {
    let status = task.status.as_ref()?;
    let report = status.node_facts.clone().unwrap_or_default();
    match status.phase {
        NodeTaskPhase::Running if report.before.is_none() && !has_agent_step(task) => {
            Some(Stage::Before)
        }
        NodeTaskPhase::Succeeded | NodeTaskPhase::Skipped
            if report.before.is_some() && report.after.is_none() =>
        {
            Some(Stage::After)
        }
        _ => None,
    }
}

/// A report as written: the facts, with `collectedAt` in microseconds like the step times
/// it is compared with (a `Time` serialises whole seconds).
pub fn body(facts: &NodeFacts) -> serde_json::Value {
    let mut body = json!(facts);
    body["collectedAt"] = json!(precise(facts.collected_at.0));
    body
}

/// Whether field manager `manager` owns `status.nodeFacts.<stage>` of `task` (from its
/// `managedFields`).
pub fn owns(task: &NodeTask, manager: &str, stage: Stage) -> bool {
    let key = format!("f:{}", stage.field());
    task.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.manager.as_deref() == Some(manager))
        .filter_map(|m| m.fields_v1.as_ref())
        .any(|f| f.0["f:status"]["f:nodeFacts"].get(&key).is_some())
}

/// The reports a write under step manager `manager` must carry again because that manager
/// wrote them before: `before` as this process wrote it, else (this process did not, a
/// restarted agent) as the status holds it; `after` as the status holds it.
pub fn carried(
    agent: &Agent,
    task: &NodeTask,
    manager: &str,
) -> serde_json::Map<String, serde_json::Value> {
    let mut out = serde_json::Map::new();
    let report = task
        .status
        .as_ref()
        .and_then(|s| s.node_facts.clone())
        .unwrap_or_default();
    let uid = task.uid().unwrap_or_default();
    if let Some(before) = agent.facts_written.before(&uid) {
        out.insert("before".into(), before);
    } else if owns(task, manager, Stage::Before)
        && let Some(before) = &report.before
    {
        out.insert("before".into(), body(before));
    }
    if owns(task, manager, Stage::After)
        && let Some(after) = &report.after
    {
        out.insert("after".into(), body(after));
    }
    out
}

/// Reads `before` for a step start write of task `task` and remembers it (see
/// [`Written`]). Returns it as written. `kubelet_version` is what this agent's Node reported
/// when the step gate read it a moment before (the same reconcile), so the Node is not read
/// twice for one step start.
pub async fn read_before(
    agent: &Agent,
    task: &NodeTask,
    kubelet_version: Option<String>,
) -> serde_json::Value {
    let facts = collect_with(agent, kubelet_version).await;
    log_read(&task.name_any(), Stage::Before, &facts);
    let written = body(&facts);
    agent
        .facts_written
        .record_before(&task.uid().unwrap_or_default(), written.clone());
    written
}

/// Reads `after` for the result write of task `task`'s last agent step. Returns it as
/// written; [`Written::carried_after`] is for the caller once the write landed.
pub async fn read_after(agent: &Agent, task: &NodeTask) -> serde_json::Value {
    let facts = collect(agent).await;
    log_read(&task.name_any(), Stage::After, &facts);
    body(&facts)
}

fn log_read(task: &str, stage: Stage, facts: &NodeFacts) {
    tracing::info!(
        task = %task,
        stage = stage.field(),
        kubelet = facts.kubelet_version.as_deref().unwrap_or("?"),
        kubeadm = facts.kubeadm_version.as_deref().unwrap_or("?"),
        kubectl = facts.kubectl_version.as_deref().unwrap_or("-"),
        packages = facts.packages.len(),
        certificates = facts.certificates.len(),
        "node facts read"
    );
}

/// Writes the report `task` needs on its own now, if any and if this process has not
/// written it already; and once a task whose `after` a step result carried finished, reads
/// the facts again and writes `after` anew only if they changed. Errors are API errors
/// writing the report; reading facts never fails (what cannot be read is left out).
pub async fn report_if_due(agent: &Agent, task: &NodeTask) -> Result<(), Error> {
    let uid = task.uid().unwrap_or_default();
    let status = task.status.clone().unwrap_or_default();
    let finished = matches!(
        status.phase,
        NodeTaskPhase::Succeeded | NodeTaskPhase::Skipped
    );
    let stage = match due(task) {
        Some(Stage::Before) if agent.facts_written.before(&uid).is_some() => return Ok(()),
        Some(stage) => stage,
        None if finished && agent.facts_written.recheck_due(&uid) => {
            let now = collect(agent).await;
            let carried = status.node_facts.and_then(|r| r.after);
            if carried.is_some_and(|a| crate::report::same_facts(&a, &now)) {
                tracing::debug!(task = %task.name_any(), "node facts unchanged since the last agent step; after stands");
                agent.facts_written.forget(&uid);
                agent.report_now.wake(Some(now));
                return Ok(());
            }
            return write_report(agent, task, Stage::After, &now).await;
        }
        None => return Ok(()),
    };
    let facts = collect(agent).await;
    write_report(agent, task, stage, &facts).await
}

/// Writes one report alone, under its own manager (`<manager>.facts.<stage>`).
async fn write_report(
    agent: &Agent,
    task: &NodeTask,
    stage: Stage,
    facts: &NodeFacts,
) -> Result<(), Error> {
    let uid = task.uid().unwrap_or_default();
    let name = task.name_any();
    let api: Api<NodeTask> = Api::all(agent.client.clone());
    let written = body(facts);
    let patch = json!({
        "apiVersion": "bosun.dev/v1alpha1", "kind": "NodeTask", "metadata": { "name": name },
        "status": { "nodeFacts": { stage.field(): written } },
    });
    let manager = format!("{}.facts.{}", agent.manager, stage.field());
    api.patch_status(
        &name,
        &PatchParams::apply(&manager).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(bosun_cluster::Error::kube(format!(
        "writing the node facts of NodeTask {name}"
    )))?;
    match stage {
        Stage::Before => agent.facts_written.record_before(&uid, written),
        Stage::After => {
            agent.facts_written.forget(&uid);
            // The task changed the node: the standing report looks now, not at its period.
            agent.report_now.wake(Some(facts.clone()));
        }
    }
    log_read(&name, stage, facts);
    Ok(())
}

/// Reads the node's facts now. The Node object is read for the kubelet's version; if it
/// cannot be read, that version is left out.
pub async fn collect(agent: &Agent) -> NodeFacts {
    let nodes: Api<Node> = Api::all(agent.client.clone());
    let kubelet_version = match nodes.get_opt(&agent.node_name).await {
        Ok(node) => node.as_ref().and_then(kubelet_version_of),
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the Node for its kubelet version; left out of the node facts");
            None
        }
    };
    collect_with(agent, kubelet_version).await
}

/// [`collect`] with the kubelet version already read from the Node.
async fn collect_with(agent: &Agent, kubelet_version: Option<String>) -> NodeFacts {
    let host = agent.host.clone();
    let node = bosun_host::NodeContext {
        node_name: agent.node_name.clone(),
        roles: Vec::new(),
        kubelet_version: kubelet_version.clone(),
    };
    let boot = agent.boot.clone();
    let read = tokio::task::spawn_blocking(move || {
        let found = host.node_facts(&node, PROBE_TIMEOUT);
        let root = &host.config().host_root;
        let certificates = read_certificates(root);
        // Only the reports carry these (a plugin's `facts.node` and the step gate do not), so
        // they are read here rather than with every plugin's facts.
        let reboot = bosun_host::reboot::reboot_need(root, &found.kernel);
        let boot_id = boot.read();
        (found, certificates, reboot, boot_id)
    })
    .await;
    let (found, certificates, reboot, boot_id) = match read {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "reading node facts stopped; reporting the kubelet version only");
            return assemble(Timestamp::now(), kubelet_version, None, Vec::new());
        }
    };
    NodeFacts {
        reboot: Some(reboot),
        boot_id,
        ..assemble(Timestamp::now(), kubelet_version, Some(found), certificates)
    }
}

/// The node's os-release, arch, kernel and kubeadm version as
/// [`bosun_host::Host::node_facts`] reads them (for the step policy input, so policies and
/// plugins read a fact the same way); `None` only if the blocking read did not finish.
pub async fn host_facts(agent: &Agent) -> Option<bosun_host::NodeFacts> {
    let host = agent.host.clone();
    let node = bosun_host::NodeContext {
        node_name: agent.node_name.clone(),
        ..Default::default()
    };
    tokio::task::spawn_blocking(move || host.node_facts(&node, PROBE_TIMEOUT))
        .await
        .ok()
}

/// The kubelet version a Node reports, if any.
pub fn kubelet_version_of(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .node_info
        .as_ref()
        .map(|i| i.kubelet_version.clone())
        .filter(|v| !v.is_empty())
}

/// Builds the report: empty strings become absent, certificates are sorted soonest expiry
/// first (then by name) and capped at [`MAX_CERTIFICATES`], the rest counted; packages are
/// capped at [`MAX_PACKAGES`] (the host lists at most five).
pub fn assemble(
    now: Timestamp,
    kubelet_version: Option<String>,
    host: Option<bosun_host::NodeFacts>,
    mut certificates: Vec<Certificate>,
) -> NodeFacts {
    let present = |s: String| Some(s).filter(|s| !s.is_empty());
    certificates.sort_by(|a, b| {
        a.not_after
            .cmp(&b.not_after)
            .then_with(|| a.name.cmp(&b.name))
    });
    let omitted = certificates.len().saturating_sub(MAX_CERTIFICATES);
    certificates.truncate(MAX_CERTIFICATES);
    NodeFacts {
        collected_at: Time(now),
        kubelet_version,
        kubeadm_version: host.as_ref().and_then(|h| h.kubeadm_version.clone()),
        kubectl_version: host.as_ref().and_then(|h| h.kubectl_version.clone()),
        packages: host
            .as_ref()
            .map(|h| h.packages.iter().take(MAX_PACKAGES).cloned().collect())
            .unwrap_or_default(),
        os: host
            .as_ref()
            .and_then(|h| present(h.os.pretty_name.clone())),
        arch: host.as_ref().and_then(|h| present(h.arch.clone())),
        // Read beside the host's facts by `collect_with`, for the reports only.
        reboot: None,
        boot_id: None,
        kernel: host.and_then(|h| present(h.kernel)),
        certificates: certificates
            .into_iter()
            .map(|c| CertificateExpiry {
                name: c.name,
                not_after: Time(c.not_after),
            })
            .collect(),
        certificates_omitted: u32::try_from(omitted).unwrap_or(u32::MAX),
        command_confinement: Some(command_confinement()),
    }
}

/// What this node's kernel enforces around granted commands, as the NodeReport says it.
pub fn command_confinement() -> CommandConfinement {
    let support = bosun_host::confinement_support();
    let mut missing = support.missing();
    if bosun_host::command_cgroup().is_none() {
        missing.push(bosun_host::NO_COMMAND_CGROUP.to_owned());
    }
    CommandConfinement {
        landlock_abi: support.landlock_abi,
        seccomp: support.seccomp,
        missing,
    }
}

/// One certificate file of the node's kubeadm PKI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Certificate {
    /// kubeadm's name: the file stem, `etcd-` in front for `pki/etcd` (`apiserver`,
    /// `etcd-server`, `ca`, `etcd-ca`).
    pub name: String,
    pub not_after: Timestamp,
}

/// Every `*.crt` in `<root>/etc/kubernetes/pki` and `<root>/etc/kubernetes/pki/etcd`,
/// parsed as PEM X.509, in file-name order. A file that does not parse is left out with a
/// warning. Missing directories (a worker) give an empty list.
pub fn read_certificates(root: &Path) -> Vec<Certificate> {
    let mut out = Vec::new();
    for (dir, prefix) in [
        ("etc/kubernetes/pki", ""),
        ("etc/kubernetes/pki/etcd", "etcd-"),
    ] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        let mut files: Vec<std::path::PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "crt"))
            .collect();
        files.sort();
        for file in files {
            let Some(stem) = file.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            match std::fs::read(&file).ok().and_then(|pem| parse(&pem)) {
                Some(not_after) => out.push(Certificate {
                    name: format!("{prefix}{stem}"),
                    not_after,
                }),
                None => {
                    tracing::warn!(file = %file.display(), "not a PEM X.509 certificate; left out of the node facts")
                }
            }
        }
    }
    out
}

/// The notAfter of the first certificate in `pem`.
fn parse(pem: &[u8]) -> Option<Timestamp> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    Timestamp::from_second(cert.validity().not_after.timestamp()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bosun_api::node_task::{NodeFactsReport, NodeTaskSpec, NodeTaskStatus};

    fn task(phase: NodeTaskPhase, before: bool, after: bool) -> NodeTask {
        let facts = assemble(Timestamp::UNIX_EPOCH, None, None, vec![]);
        let mut t = NodeTask::new(
            "t",
            NodeTaskSpec {
                operation: "op".into(),
                node_name: "n".into(),
                group: "g".into(),
                steps: vec![],
                dry_run: false,
                step_timeout_seconds: None,
                approve: false,
                recovery: None,
            },
        );
        t.status = Some(NodeTaskStatus {
            phase,
            node_facts: Some(NodeFactsReport {
                before: before.then(|| facts.clone()),
                after: after.then(|| facts.clone()),
            }),
            ..Default::default()
        });
        t
    }

    #[test]
    fn a_report_alone_is_due_only_without_an_agent_step_to_carry_it() {
        assert_eq!(due(&task(NodeTaskPhase::Pending, false, false)), None);
        assert_eq!(
            due(&task(NodeTaskPhase::AwaitingApproval, false, false)),
            None
        );
        assert_eq!(
            due(&task(NodeTaskPhase::Running, false, false)),
            Some(Stage::Before)
        );
        assert_eq!(due(&task(NodeTaskPhase::Running, true, false)), None);
        assert_eq!(due(&task(NodeTaskPhase::Blocked, true, false)), None);
        assert_eq!(
            due(&task(NodeTaskPhase::Succeeded, true, false)),
            Some(Stage::After)
        );
        assert_eq!(
            due(&task(NodeTaskPhase::Skipped, true, false)),
            Some(Stage::After)
        );
        assert_eq!(due(&task(NodeTaskPhase::Succeeded, true, true)), None);
        // Never seen Running by an agent, or the node is gone: no report.
        assert_eq!(due(&task(NodeTaskPhase::Succeeded, false, false)), None);
        assert_eq!(due(&task(NodeTaskPhase::Invalid, true, false)), None);
        let mut fresh = task(NodeTaskPhase::Running, false, false);
        fresh.status = None;
        assert_eq!(due(&fresh), None);
        // With an agent step, `before` comes with its start write, not alone; `after` alone
        // only if the task finished without it.
        let mut with_step = task(NodeTaskPhase::Running, false, false);
        with_step.spec.steps = vec![
            serde_json::from_value(
                json!({ "name": "cordon", "runsOn": "controller", "action": "cordon" }),
            )
            .unwrap(),
            serde_json::from_value(
                json!({ "name": "greet", "plugin": "hello", "action": "greet" }),
            )
            .unwrap(),
        ];
        assert_eq!(agent_steps(&with_step), Some((1, 1)));
        assert_eq!(due(&with_step), None);
        let mut skipped = with_step.clone();
        skipped.status = task(NodeTaskPhase::Skipped, true, false).status;
        assert_eq!(due(&skipped), Some(Stage::After));
        assert_eq!(
            agent_steps(&task(NodeTaskPhase::Running, false, false)),
            None
        );
    }

    #[test]
    fn a_before_report_is_remembered_as_written_until_the_after_report_is_final() {
        let w = Written::default();
        assert_eq!(w.before("u"), None);
        let body = json!({ "collectedAt": "2026-01-02T03:04:05.123456Z" });
        w.record_before("u", body.clone());
        assert_eq!(w.before("u"), Some(body));
        assert!(!w.recheck_due("u"));
        w.carried_after("u");
        assert!(w.recheck_due("u"));
        w.forget("u");
        assert_eq!(w.before("u"), None);
        assert!(!w.recheck_due("u"));
        w.with(|i| assert!(i.before.is_empty() && i.recheck.is_empty()));
    }

    #[test]
    fn ownership_of_a_report_is_read_from_the_managed_fields() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
        let mut t = task(NodeTaskPhase::Running, true, false);
        let entry = |manager: &str, fields: serde_json::Value| ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some("Apply".into()),
            subresource: Some("status".into()),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        };
        t.metadata.managed_fields = Some(vec![
            entry(
                "a.step.greet",
                json!({ "f:status": { "f:nodeFacts": { "f:before": { ".": {} } }, "f:steps": {} } }),
            ),
            entry("a.step.other", json!({ "f:status": { "f:steps": {} } })),
        ]);
        assert!(owns(&t, "a.step.greet", Stage::Before));
        assert!(!owns(&t, "a.step.greet", Stage::After));
        assert!(!owns(&t, "a.step.other", Stage::Before));
        assert!(!owns(&t, "a.facts.before", Stage::Before));
    }

    fn cert(name: &str, second: i64) -> Certificate {
        Certificate {
            name: name.into(),
            not_after: Timestamp::from_second(second).unwrap(),
        }
    }

    #[test]
    fn certificates_are_sorted_soonest_first_and_capped() {
        let mut certs: Vec<Certificate> = (0..40)
            .map(|i| cert(&format!("c{i:02}"), 2_000_000_000 - i))
            .collect();
        certs.push(cert("a-tie", 2_000_000_000 - 39));
        let facts = assemble(Timestamp::UNIX_EPOCH, Some("v1.34.4".into()), None, certs);
        assert_eq!(facts.certificates.len(), MAX_CERTIFICATES);
        assert_eq!(facts.certificates_omitted, 41 - MAX_CERTIFICATES as u32);
        assert_eq!(facts.certificates[0].name, "a-tie");
        assert_eq!(facts.certificates[1].name, "c39");
        assert!(
            facts
                .certificates
                .windows(2)
                .all(|w| w[0].not_after <= w[1].not_after)
        );
        assert_eq!(facts.kubelet_version.as_deref(), Some("v1.34.4"));
        assert_eq!(facts.kubeadm_version, None);
    }

    #[test]
    fn empty_host_values_are_absent_not_empty() {
        let host = bosun_host::NodeFacts {
            node_name: "n".into(),
            roles: vec![],
            os: bosun_host::OsRelease {
                pretty_name: "Debian GNU/Linux 13 (trixie)".into(),
                ..Default::default()
            },
            arch: "amd64".into(),
            kernel: String::new(),
            kubelet_version: None,
            kubeadm_version: Some("v1.34.4".into()),
            kubectl_version: None,
            packages: vec![bosun_api::node_task::PackageVersion {
                name: "kubeadm".into(),
                version: "1.34.4-1.1".into(),
            }],
        };
        let facts = assemble(Timestamp::UNIX_EPOCH, None, Some(host), vec![]);
        assert_eq!(facts.os.as_deref(), Some("Debian GNU/Linux 13 (trixie)"));
        assert_eq!(facts.arch.as_deref(), Some("amd64"));
        assert_eq!(facts.kernel, None);
        assert_eq!(facts.kubeadm_version.as_deref(), Some("v1.34.4"));
        assert_eq!(facts.kubectl_version, None, "not installed, not guessed");
        assert_eq!(facts.packages.len(), 1);
        assert_eq!(facts.packages[0].version, "1.34.4-1.1");
        let json = serde_json::to_value(&facts).unwrap();
        assert!(json.get("kubectlVersion").is_none(), "{json}");
        assert_eq!(
            json["packages"],
            serde_json::json!([{"name": "kubeadm", "version": "1.34.4-1.1"}])
        );
    }

    #[test]
    fn a_missing_pki_gives_no_certificates_and_garbage_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        assert!(read_certificates(dir.path()).is_empty());
        std::fs::create_dir_all(dir.path().join("etc/kubernetes/pki/etcd")).unwrap();
        std::fs::write(
            dir.path().join("etc/kubernetes/pki/broken.crt"),
            "not a certificate",
        )
        .unwrap();
        assert!(read_certificates(dir.path()).is_empty());
    }
}
