//! The agent's gates around a plugin step: built-in preflight, capabilities, step policy.
//!
//! Order, for one step (see [`Prepared::run`]):
//! 1. [`prepare`] (before the step is marked Running): the compiled policy set of the
//!    agent's instance (waiting for the first Policy list; nothing runs before it), and the
//!    facts the policies read: the Operation, the Node, the cluster's version, annotations
//!    and control-plane nodes, os-release from the host root, the time. Then, still
//!    before the step is marked Running, the cordon check ([`bosun_cluster::cordon`]): a
//!    step inside the window of the task's cordon does not start on a node someone else
//!    uncordoned (the task blocks as CordonCleared; see `run_step_inner` in the crate root).
//! 2. The built-in checks of [`crate::preflight`]; a failure blocks the task
//!    (PreflightFailed) before the plugin is loaded.
//! 3. Once the host has verified, compiled and described the plugin: the capabilities
//!    gate — requested ⊆ granted, then `data.bosun.capabilities.deny`.
//! 4. The plugin's own preflight (in [`crate::step::execute`]).
//! 5. The step gate, right before `run`: `data.bosun.step.deny` with the node facts, every
//!    preflight result (built-in and plugin), the plugin's signer and the time.
//!
//! A deny (from a Deny policy, or from any broken policy: fail closed) blocks the task
//! with reason PolicyDenied, the deny messages in the task message and the step status,
//! and a Warning Event on the NodeTask. Warn and Audit findings are recorded in the step
//! status (`policy.messages`) and the step proceeds; Warn findings are also an Event.
//! Every recorded decision carries the digest of the policy set that made it.

use std::path::Path;
use std::sync::{Arc, Mutex};

use bosun_api::grants::Grants;
use bosun_api::node_task::{
    BlockReason, CheckStatus as ApiCheck, NodeTask, PolicyDecision, PolicyMessage, PreflightCheck,
};
use bosun_api::operation::Operation;
use bosun_api::policy::Enforcement as ApiEnforcement;
use bosun_cluster::events::Notice;
use bosun_cluster::policies::{Generation, SYNC_WAIT};
use bosun_cluster::readers::{
    cluster_annotations, cluster_version, control_plane, get_cached_or_consistent, is_ready,
    operation_ref, roles_of,
};
use bosun_host::{LoadedPlugin, NodeContext};
use bosun_policy::capabilities::RequestedCapabilities;
use bosun_policy::input::{
    CapabilitiesInput, CertificateFact, CheckStatus, ClusterState, NodeFacts, OperationKind,
    OperationRef, OsRelease, PluginInfo, PreflightResult, StepInput, StepRef, TaskRef,
};
use bosun_policy::{Decision, Finding};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::plugins::Resolved;
use crate::step::{StepCall, StepResult, execute};
use crate::{Agent, Error};

/// The hooks [`crate::step::execute`] calls around a plugin's preflight.
pub trait Gate: Send + Sync {
    /// After the plugin was verified, compiled and described; before any call into it.
    /// `Err` is the failed step to report instead of running anything.
    fn loaded(&self, plugin: &LoadedPlugin) -> Result<(), Box<StepResult>>;
    /// After the plugin's preflight passed, right before `run`.
    fn before_run(
        &self,
        plugin: &LoadedPlugin,
        preflight: &[PreflightCheck],
    ) -> Result<(), Box<StepResult>>;
}

/// Everything gathered for one step before it starts.
pub struct Prepared {
    generation: Arc<Generation>,
    node: NodeFacts,
    node_ready: Option<bool>,
    /// The Node's `spec.unschedulable` as read (`None`: no such Node).
    unschedulable: Option<bool>,
    operation: OperationRef,
    task: TaskRef,
    cluster: ClusterState,
    decisions: Mutex<Decisions>,
}

#[derive(Default)]
struct Decisions {
    capabilities: Option<Decision>,
    step: Option<Decision>,
    /// The input documents of the two decisions, for [`PolicyDecision::input`].
    capabilities_input: Option<serde_json::Value>,
    step_input: Option<serde_json::Value>,
}

/// Reads what the gates need. Errors (API unreachable, policies not listed yet) leave the
/// step untouched; the reconcile is retried.
pub async fn prepare(agent: &Agent, task: &NodeTask) -> Result<Prepared, Error> {
    // The set as the API server holds it now (a quorum read of the Policies' metadata): a
    // Policy created or deleted just before this step decides it, even when this agent's
    // Policy watch reached an API server that stopped delivering.
    let generation = agent
        .policies
        .current(SYNC_WAIT)
        .await
        .map_err(|e| Error::Gate(e.to_string()))?;
    // This node and the control planes, not every Node: every agent reads these before
    // every step, and a full list costs each of them the whole fleet. The reads do not
    // depend on each other (but for the control planes' tasks, which need their Nodes), so
    // they go out together: a step waits for the slowest, not for their sum (at 1,000
    // nodes on one API server that sum was seconds: docs/benchmarks.md).
    let nodes: Api<Node> = Api::all(agent.client.clone());
    let operations: Api<Operation> = Api::all(agent.client.clone());
    let task_version = task.metadata.resource_version.as_deref();
    let control_plane_state = async {
        // The control planes' Nodes from the watch cache as it is (their readiness is a
        // heartbeat's, seconds old by nature); their NodeTasks no older than this task
        // (the cache the task came from: no wait), so a control plane's step that ended
        // before this task started is seen ended.
        let control_planes = nodes
            .list(
                &ListParams::default()
                    .labels(bosun_cluster::readers::CONTROL_PLANE_SELECTOR)
                    .match_any(),
            )
            .await
            .map_err(bosun_cluster::Error::kube(
                "listing the control-plane Nodes",
            ))?
            .items;
        control_plane(&agent.client, &control_planes, task_version)
            .await
            .map_err(|e| Error::Gate(e.to_string()))
    };
    // No read waits for a cache to reach this task's version: that is a wait on another
    // resource's cache for a progress notice from etcd, and at 1,000 nodes it ran past the
    // API server's limit thousands of times (a 504, the step retried seconds later;
    // docs/benchmarks.md). This agent's Node is one key read from etcd (exact: its kubelet
    // version is the step's `before` fact). The Operation comes from the watch cache (its
    // kind and target version never change; a consistent read of it, whose status holds the
    // whole plan, took 4.2 s each at 1,000 nodes), read consistently only when the cache
    // does not hold it yet.
    let (own, operation, version, annotations, control_plane_now, found) = tokio::join!(
        nodes.get_opt(&agent.node_name),
        get_cached_or_consistent(&operations, &task.spec.operation),
        cluster_version(&agent.client),
        cluster_annotations(&agent.client),
        control_plane_state,
        // os-release, arch, kernel and kubeadm exactly as a plugin's `facts.node` sees them.
        crate::facts::host_facts(agent),
    );
    let own = own.map_err(bosun_cluster::Error::kube("reading this agent's Node"))?;
    let own = ready_or_grace_passed(&nodes, &agent.node_name, own).await;
    let node = own.as_ref();
    let operation =
        match operation.map_err(bosun_cluster::Error::kube("reading the task's Operation"))? {
            Some(op) => operation_ref(&op),
            None => OperationRef {
                name: task.spec.operation.clone(),
                kind: OperationKind::Custom,
                target_version: None,
                execution_mode: None,
                annotations: Default::default(),
            },
        };
    let cluster = ClusterState {
        version,
        annotations,
        control_plane: control_plane_now?,
    };
    let facts = node_facts(agent, node, found);
    Ok(Prepared {
        generation,
        node_ready: node.map(is_ready),
        unschedulable: node.map(|n| {
            n.spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false)
        }),
        node: facts,
        operation,
        task: TaskRef {
            node: agent.node_name.clone(),
            group: task.spec.group.clone(),
        },
        cluster,
        decisions: Mutex::new(Decisions::default()),
    })
}

/// This node's facts as policies see them: from its Node object, and from the host as a
/// plugin's `facts.node` sees it (`found`).
fn node_facts(
    agent: &Agent,
    node: Option<&Node>,
    found: Option<bosun_host::NodeFacts>,
) -> NodeFacts {
    let host_root = agent.host.config().host_root.clone();
    let os = found.as_ref().map(|f| f.os.clone()).unwrap_or_default();
    let c = crate::facts::command_confinement();
    NodeFacts {
        name: agent.node_name.clone(),
        roles: node.map(roles_of).unwrap_or_default(),
        ready: node.is_some_and(is_ready),
        os: OsRelease {
            id: os.id,
            id_like: os.id_like,
            version_id: os.version_id,
            pretty_name: os.pretty_name,
        },
        arch: found.as_ref().map(|f| f.arch.clone()),
        kernel: found
            .as_ref()
            .map(|f| f.kernel.clone())
            .filter(|k| !k.is_empty()),
        kubelet_version: node.and_then(crate::facts::kubelet_version_of),
        kubeadm_version: found.and_then(|f| f.kubeadm_version),
        annotations: node.map(|n| n.annotations().clone()).unwrap_or_default(),
        certificates: certificates(&host_root),
        confinement: bosun_policy::input::Confinement {
            landlock_abi: c.landlock_abi,
            seccomp: c.seccomp,
            missing: c.missing,
        },
        service_manager: agent.host.config().service_backend.manager().to_owned(),
    }
}

/// How long the gate reads a Node that is not Ready again before the step's preflight
/// judges it: longer than a control plane's own components take to restart during its
/// upgrade, short beside the step's timeout.
pub const READY_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// `own`, or the Node read again every 2 s while it is not Ready, for at most
/// [`READY_GRACE`]. A Node can be NotReady for a moment while `kubeadm upgrade apply`
/// restarts its control plane (its etcd member, then the API server its kubelet reports
/// through); an agent that came back in that moment (the real-node test deletes the agent's
/// Pod mid-upgrade, and the step then resumes) blocked the task on `agent/node-ready` at
/// once, for a person to retry what would have passed seconds later. A Node still not
/// Ready after the grace, or gone, is judged as it is; a failed read keeps the last one.
async fn ready_or_grace_passed(
    nodes: &Api<Node>,
    name: &str,
    mut own: Option<Node>,
) -> Option<Node> {
    let started = std::time::Instant::now();
    if own.as_ref().is_some_and(|n| !is_ready(n)) {
        tracing::info!(grace = ?READY_GRACE, "this Node is not Ready; reading it again before the preflight judges it");
    }
    while own.as_ref().is_some_and(|n| !is_ready(n)) && started.elapsed() < READY_GRACE {
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        match nodes.get_opt(name).await {
            Ok(now) => own = now,
            Err(e) => {
                tracing::debug!(error = %e, "reading this Node again failed; keeping the last read")
            }
        }
    }
    own
}

impl Prepared {
    /// The kubelet version this agent's Node reported when the gate read it.
    pub fn kubelet_version(&self) -> Option<String> {
        self.node.kubelet_version.clone()
    }

    /// This node's os-release as the gate read it from the host root, for choosing a
    /// backend ([`crate::backends`]).
    pub fn os(&self) -> crate::backends::NodeOs {
        crate::backends::NodeOs {
            id: self.node.os.id.clone(),
            id_like: self.node.os.id_like.clone(),
        }
    }

    /// This agent's Node's `spec.unschedulable` when the gate read it (from the API server,
    /// right before the step would start); `None` when the Node was not found.
    pub fn unschedulable(&self) -> Option<bool> {
        self.unschedulable
    }

    /// The context the host gives the plugin.
    pub fn node_context(&self) -> NodeContext {
        NodeContext {
            node_name: self.node.name.clone(),
            roles: self.node.roles.clone(),
            kubelet_version: self.node.kubelet_version.clone(),
        }
    }

    /// Runs step `index` of `task` with `resolved`: built-in checks, then the host with the
    /// capabilities and step gates. Blocking work runs on a blocking thread. `resumed`: the
    /// previous attempt was interrupted (see [`crate::resumes_interrupted`]).
    pub async fn run(
        self: Arc<Self>,
        agent: &Agent,
        task: &NodeTask,
        index: usize,
        resolved: Resolved,
        resumed: bool,
    ) -> Result<StepResult, Error> {
        let step = &task.spec.steps[index];
        let grants = resolved.plugin.spec.grants.clone();
        let host_root = agent.host.config().host_root.clone();
        let builtin = crate::preflight::run_all(
            agent.preflight,
            &crate::preflight::Facts {
                host_root: &host_root,
                grants: &grants,
                node_ready: self.node_ready,
                kubelet_version: self.node.kubelet_version.as_deref(),
                api_server_version: self.cluster.version.as_deref(),
            },
        );
        let builtin_status: Vec<PreflightCheck> = builtin.iter().map(api_check).collect();
        let failed: Vec<String> = builtin
            .iter()
            .filter(|c| c.status == CheckStatus::Fail)
            .map(|c| format!("{}: {}", c.name, c.message))
            .collect();
        if !failed.is_empty() {
            let mut r = StepResult::failed(
                BlockReason::PreflightFailed,
                "preflight-failed",
                format!(
                    "preflight failed ({}); fix the cause on the node, then retry",
                    failed.join("; ")
                ),
                true,
            );
            r.preflight = builtin_status;
            return Ok(r);
        }
        let gate = StepGate {
            prepared: self.clone(),
            step: StepRef {
                name: step.name.clone(),
                plugin: step.plugin.clone().unwrap_or_default(),
                action: step.action.clone(),
                params: step.params.clone().unwrap_or_else(|| serde_json::json!({})),
            },
            grants: grants.clone(),
            builtin,
        };
        let host = agent.host.clone();
        let node = self.node_context();
        let action = step.action.clone();
        let params_json = step
            .params
            .clone()
            .unwrap_or_else(|| serde_json::json!({}))
            .to_string();
        let dry_run = task.spec.dry_run;
        let timeout = task
            .spec
            .step_timeout_seconds
            .map(|s| std::time::Duration::from_secs(u64::from(s)));
        let mut result = tokio::task::spawn_blocking(move || {
            let call = StepCall {
                action: &action,
                params_json,
                grants: &grants,
                dry_run,
                resumed,
                timeout,
            };
            execute(&host, &resolved, &node, &call, &gate)
        })
        .await?;
        // The plugin's own checks first (their order is the plugin's), then the agent's.
        result.preflight.extend(builtin_status);
        Ok(result)
    }

    /// What the policies said about this step (capabilities and step decisions together),
    /// for the step's status; `None` when no gate was reached.
    pub fn decision(&self) -> Option<PolicyDecision> {
        let d = self.decisions.lock().ok()?;
        let decisions: Vec<&Decision> = d.capabilities.iter().chain(d.step.iter()).collect();
        let first = decisions.first()?;
        let mut messages = Vec::new();
        for decision in &decisions {
            let tagged = |list: &[Finding], e: ApiEnforcement| {
                list.iter()
                    .map(move |f| PolicyMessage {
                        policy: f.policy.clone(),
                        enforcement: e,
                        message: f.message.clone(),
                    })
                    .collect::<Vec<_>>()
            };
            messages.extend(tagged(&decision.denies, ApiEnforcement::Deny));
            messages.extend(tagged(&decision.warnings, ApiEnforcement::Warn));
            messages.extend(tagged(&decision.audits, ApiEnforcement::Audit));
        }
        let capabilities_denied = d.capabilities.as_ref().is_some_and(|c| !c.allowed);
        let input = if capabilities_denied || d.step_input.is_none() {
            d.capabilities_input.clone()
        } else {
            d.step_input.clone()
        };
        Some(PolicyDecision {
            allowed: decisions.iter().all(|d| d.allowed),
            // Only when a policy objected: that is when someone replays it, and a status
            // need not carry every allowed step's facts.
            input: if messages.is_empty() { None } else { input },
            messages,
            policy_set_digest: Some(first.policy_set_digest.clone()),
        })
    }

    /// Publishes a Warning Event on the task for a deny (reason PolicyDenied) or for Warn
    /// findings (reason PolicyWarning). Best effort: a refused Event is logged.
    pub async fn publish_events(&self, agent: &Agent, task: &NodeTask, step: &str) {
        let Some(decision) = self.decision() else {
            return;
        };
        let pick = |e: ApiEnforcement| {
            decision
                .messages
                .iter()
                .filter(|m| m.enforcement == e)
                .map(|m| format!("{}: {}", m.policy, m.message))
                .collect::<Vec<_>>()
        };
        let digest = decision.policy_set_digest.clone().unwrap_or_default();
        let mut events = Vec::new();
        if !decision.allowed {
            events.push((
                "PolicyDenied",
                format!(
                    "step {step} denied by policy: {} (policy set {digest})",
                    pick(ApiEnforcement::Deny).join("; ")
                ),
            ));
        }
        let warnings = pick(ApiEnforcement::Warn);
        if !warnings.is_empty() {
            events.push((
                "PolicyWarning",
                format!("step {step}: {} (policy set {digest})", warnings.join("; ")),
            ));
        }
        let publisher = agent.events();
        for (reason, note) in events {
            publisher
                .publish(task, &Notice::warning(reason, "PolicyGate", note))
                .await;
        }
    }
}

/// The gate [`crate::step::execute`] calls for one step.
struct StepGate {
    prepared: Arc<Prepared>,
    step: StepRef,
    grants: Grants,
    builtin: Vec<PreflightResult>,
}

impl StepGate {
    fn plugin_info(plugin: &LoadedPlugin) -> PluginInfo {
        let m = plugin.metadata();
        PluginInfo {
            name: m.name.clone(),
            version: m.version.clone(),
            digest: plugin.digest().to_string(),
            signer: plugin.verified().map(|v| format!("{:#}", v.key_id)),
        }
    }

    fn denied(&self, code: &str, what: &str, decision: &Decision) -> StepResult {
        StepResult::failed(
            BlockReason::PolicyDenied,
            code,
            format!(
                "{what} denied by policy: {} (policy set {}); fix the cause or the policy, then set spec.recovery: Retry",
                decision.deny_messages().join("; "),
                decision.policy_set_digest
            ),
            true,
        )
    }
}

impl Gate for StepGate {
    fn loaded(&self, plugin: &LoadedPlugin) -> Result<(), Box<StepResult>> {
        let requested = requested_of(&plugin.metadata().capabilities);
        let info = Self::plugin_info(plugin);
        let node = self.prepared.node.name.clone();
        let clock = std::time::Instant::now();
        let decision = self
            .prepared
            .generation
            .with_evaluator(|e| e.capabilities(&info, &requested, &self.grants, Some(&node)));
        bosun_telemetry::metrics().gate_finished(bosun_telemetry::Gate::Policy, clock.elapsed());
        let allowed = decision.allowed;
        let result = (!allowed).then(|| {
            self.denied(
                "capabilities-denied",
                "the plugin's capabilities were",
                &decision,
            )
        });
        if let Ok(mut d) = self.prepared.decisions.lock() {
            let input = CapabilitiesInput {
                plugin: info,
                requested,
                grants: self.grants.clone(),
                node: Some(node),
            };
            d.capabilities_input = serde_json::to_value(&input).ok();
            d.capabilities = Some(decision);
        }
        result.map_or(Ok(()), |r| Err(Box::new(r)))
    }

    fn before_run(
        &self,
        plugin: &LoadedPlugin,
        preflight: &[PreflightCheck],
    ) -> Result<(), Box<StepResult>> {
        let p = &self.prepared;
        let source = plugin.metadata().name.clone();
        let mut results = self.builtin.clone();
        results.extend(preflight.iter().map(|c| PreflightResult {
            name: c.name.clone(),
            status: match c.status {
                ApiCheck::Pass => CheckStatus::Pass,
                ApiCheck::Warn => CheckStatus::Warn,
                ApiCheck::Fail => CheckStatus::Fail,
            },
            message: c.message.clone(),
            source: source.clone(),
        }));
        let input = StepInput {
            operation: p.operation.clone(),
            task: p.task.clone(),
            step: self.step.clone(),
            plugin: Self::plugin_info(plugin),
            grants: self.grants.clone(),
            node: p.node.clone(),
            preflight: results,
            cluster: p.cluster.clone(),
            now: Timestamp::now().to_string(),
        };
        let clock = std::time::Instant::now();
        let decision = p.generation.with_evaluator(|e| e.step(&input));
        bosun_telemetry::metrics().gate_finished(bosun_telemetry::Gate::Policy, clock.elapsed());
        for f in &decision.warnings {
            tracing::warn!(policy = %f.policy, message = %f.message, "policy warning");
        }
        let result = (!decision.allowed).then(|| {
            self.denied(
                "policy-denied",
                &format!("step {}", self.step.name),
                &decision,
            )
        });
        if let Ok(mut d) = p.decisions.lock() {
            d.step_input = serde_json::to_value(&input).ok();
            d.step = Some(decision);
        }
        result.map_or(Ok(()), |r| Err(Box::new(r)))
    }
}

fn api_check(r: &PreflightResult) -> PreflightCheck {
    PreflightCheck {
        name: r.name.clone(),
        status: match r.status {
            CheckStatus::Pass => ApiCheck::Pass,
            CheckStatus::Warn => ApiCheck::Warn,
            CheckStatus::Fail => ApiCheck::Fail,
        },
        message: r.message.clone(),
    }
}

/// The host's view of what a plugin asked for, as the capabilities input names it (the
/// same conversion `kubectl-bosun plugin run` uses).
pub fn requested_of(c: &bosun_host::Capabilities) -> RequestedCapabilities {
    RequestedCapabilities::from_parts(&c.filesystem, &c.exec, &c.services, &c.http)
}

/// kubeadm's leaf certificates under the host root (`etc/kubernetes/pki/*.crt` and
/// `pki/etcd/*.crt`, CAs left out: kubeadm does not renew them) with their expiry, named
/// as `kubeadm certs check-expiration` names them (`apiserver`, `etcd-server` ...). A file
/// that does not parse is left out. Empty on a node without kubeadm PKI (workers).
pub fn certificates(root: &Path) -> Vec<CertificateFact> {
    crate::facts::read_certificates(root)
        .into_iter()
        .filter(|c| c.name != "ca" && !c.name.ends_with("-ca"))
        .map(|c| CertificateFact {
            name: c.name,
            not_after: c.not_after.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubeadm_leaf_certificates_are_read_with_their_expiry() {
        let dir = tempfile::tempdir().unwrap();
        let pki = dir.path().join("etc/kubernetes/pki");
        std::fs::create_dir_all(pki.join("etcd")).unwrap();
        let make = |path: &Path, days: &str| {
            let ok = std::process::Command::new("openssl")
                .args([
                    "req",
                    "-x509",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:prime256v1",
                    "-nodes",
                    "-subj",
                    "/CN=test",
                    "-days",
                    days,
                ])
                .arg("-keyout")
                .arg(path.with_extension("key"))
                .arg("-out")
                .arg(path)
                .output()
                .expect("openssl runs")
                .status
                .success();
            assert!(ok, "openssl made {}", path.display());
        };
        make(&pki.join("apiserver.crt"), "30");
        make(&pki.join("ca.crt"), "3650");
        make(&pki.join("etcd/server.crt"), "365");
        std::fs::write(pki.join("broken.crt"), "not a certificate").unwrap();
        let certs = certificates(dir.path());
        let names: Vec<&str> = certs.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec!["apiserver", "etcd-server"]);
        let in_days = |c: &CertificateFact| {
            let t: Timestamp = c.not_after.parse().unwrap();
            (t.as_second() - Timestamp::now().as_second()) / 86_400
        };
        assert!((29..=30).contains(&in_days(&certs[0])), "{:?}", certs[0]);
        assert!((364..=365).contains(&in_days(&certs[1])), "{:?}", certs[1]);
        assert!(certificates(&dir.path().join("worker")).is_empty());
    }

    #[test]
    fn requested_capabilities_keep_every_request() {
        let c = bosun_host::Capabilities {
            filesystem: vec![("/etc".into(), false)],
            exec: vec![("/usr/bin/uname".into(), vec!["-r".into()])],
            services: vec![("kubelet.service".into(), vec!["restart".into()])],
            http: vec!["dl.k8s.io".into()],
        };
        let r = requested_of(&c);
        assert_eq!(
            r.filesystem,
            vec![bosun_policy::capabilities::PathRequest {
                path: "/etc".into(),
                writable: false
            }]
        );
        assert_eq!(r.exec[0].args, vec!["-r"]);
        assert_eq!(r.services[0].unit, "kubelet.service");
        assert_eq!(r.http, vec!["dl.k8s.io"]);
    }
}
