//! The `kubeadm-upgrade` plugin against a copy of a lab control-plane node root (the real
//! kubeadm v1.34.4 and kubeadm-made manifests), through the real sandbox with the grants
//! of deploy/examples/plugins/kubeadm-upgrade.yaml. `apply` and `node` are run for real
//! only where they are no-ops or dry runs: a real `kubeadm upgrade apply` would change the
//! lab's shared cluster. `plan` (and the dry run of `apply`, which runs it) succeeds for
//! real against the lab, made to look enough like a kubeadm cluster ([`KubeadmCluster`]).

use std::path::Path;

use bosun_plugins_tests::{
    Node, Ran, copy_tree, example_grants, example_grants_for_lab, install_programs, plugins, write,
};
use serde_json::json;

fn failed(ran: &Ran, check: &str) -> String {
    assert!(
        ran.run.is_none(),
        "preflight should have failed: {:?}",
        ran.checks
    );
    ran.failed_checks()
        .into_iter()
        .find(|(n, _)| n == check)
        .unwrap_or_else(|| panic!("no failed {check}: {:?}", ran.checks))
        .1
}

#[test]
fn preflight_enforces_one_minor_step_no_downgrade_and_kubeadm_at_target() {
    let (lab, cp) = bosun_plugins_tests::lab_control_plane();
    let version = lab.kubernetes_version.clone();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    copy_tree(&cp.host_root, &root);

    let node = Node::new(&root, &["control-plane"]);
    let plugin = node.load(&plugins().kubeadm_upgrade, "kubeadm-upgrade");
    let grants = example_grants_for_lab("kubeadm-upgrade.yaml", lab.ports);
    let run = |action: &str, v: &str, dry: bool| {
        node.run(
            &plugin,
            &grants,
            action,
            &json!({"kubernetesVersion": v}),
            dry,
        )
    };

    // Already there: preflight passes (kubeadm at the target), apply changes nothing.
    let same = run("apply", &version, false);
    assert!(same.failed_checks().is_empty(), "{:?}", same.checks);
    assert_eq!(
        same.outcome().message,
        format!("the control plane already runs {version}; nothing to apply")
    );
    assert!(!same.outcome().changed);

    assert!(
        failed(&run("apply", "v1.36.0", false), "version-step").contains("skips a minor version")
    );
    assert!(failed(&run("apply", "v1.33.9", false), "version-step").contains("does not downgrade"));
    // kubeadm not at the target: only a warning in preflight (the upgrade's packages step
    // installs it between the task's start and this step, and installs nothing in a dry
    // run), but `apply` refuses to run with it, and a dry run says what it would run.
    let behind = run("apply", "v1.35.0", false);
    let warned = behind
        .checks
        .iter()
        .find(|c| c.name == "kubeadm-version")
        .expect("a kubeadm-version check");
    assert_eq!(warned.status, bosun_host::CheckStatus::Warn, "{warned:?}");
    let e = behind.error();
    assert_eq!(e.code, "kubeadm-version");
    assert!(
        e.message
            .contains(&format!("/usr/bin/kubeadm is {version}, not v1.35.0"))
            && e.message.contains("install kubeadm v1.35.0 first"),
        "{}",
        e.message
    );
    let dry_behind = run("apply", "v1.35.0", true);
    assert_eq!(
        dry_behind.outcome().message,
        format!(
            "would run `kubeadm upgrade apply --yes v1.35.0` with kubeadm v1.35.0 once the upgrade's packages step \
             installed it (/usr/bin/kubeadm is {version}, not v1.35.0)"
        )
    );

    // `plan` runs the real `kubeadm upgrade plan` through the exec grant, against the lab's
    // API server (the copy's admin.conf points there), made to look like a kubeadm cluster
    // for it (see `KubeadmCluster`): kubeadm's preflight, its configuration from the
    // cluster, its health check and its version lookup all pass.
    let _cluster = KubeadmCluster::prepare(&lab, &cp);
    let plan = run("plan", &version, false);
    assert!(plan.failed_checks().is_empty(), "{:?}", plan.checks);
    let outcome = plan.outcome();
    assert_eq!(
        outcome.message,
        format!("kubeadm upgrade plan {version}: see the log for kubeadm's plan")
    );
    assert!(!outcome.changed);
    let said = plan_output(outcome);
    let minor = version.trim_start_matches('v');
    for line in [
        format!("[upgrade/versions] Cluster version: {minor}"),
        format!("[upgrade/versions] kubeadm version: {version}"),
        format!("[upgrade/versions] Target version: {version}"),
    ] {
        assert!(
            said.contains(&line),
            "kubeadm's plan lacks {line:?}:\n{said}"
        );
    }

    // One minor behind: the step to the lab's version is allowed, and with kubeadm at the
    // target the dry run runs `kubeadm upgrade plan` (the one kubeadm command its grant
    // marks `dryRun`) and reports that it passed, with kubeadm's plan.
    let manifest = root.join("etc/kubernetes/manifests/kube-apiserver.yaml");
    let text = std::fs::read_to_string(&manifest).unwrap().replace(
        &format!("kube-apiserver:{version}"),
        "kube-apiserver:v1.33.7",
    );
    std::fs::write(&manifest, text).unwrap();
    let dry = run("apply", &version, true);
    assert!(
        dry.checks.iter().any(|c| c.name == "version-step"
            && c.message == format!("v1.33.7 (control plane) → {version}")),
        "{:?}",
        dry.checks
    );
    let outcome = dry.outcome();
    assert_eq!(
        outcome.message,
        format!(
            "would run `kubeadm upgrade apply --yes {version}`; `kubeadm upgrade plan {version}` passed (its plan is in the log)"
        )
    );
    let said = plan_output(outcome);
    assert!(
        said.contains(&format!("[upgrade/versions] Target version: {version}")),
        "{said}"
    );

    // `apply` belongs on a control-plane node.
    let worker = Node::new(&root, &["worker"]);
    let wp = worker.load(&plugins().kubeadm_upgrade, "kubeadm-upgrade");
    let on_worker = worker.run(
        &wp,
        &grants,
        "apply",
        &json!({"kubernetesVersion": version}),
        false,
    );
    assert!(failed(&on_worker, "control-plane").contains("is not a control-plane node"));
}

/// Where the stand-in kubeadm of [`control_plane_at`] appends its arguments, one call a
/// line: kubeadm's own scratch directory, inside what the example's sandbox lets
/// `kubeadm upgrade apply|node` write. `kubeadm upgrade plan` may write nothing there (its
/// grant reads /etc/kubernetes), so a plan is seen in its output instead.
const KUBEADM_CALLS: &str = "etc/kubernetes/tmp/kubeadm-calls";

/// A control-plane node root whose three static Pod manifests all run `version` and whose
/// dpkg database says kubeadm `version` is installed (the host's kubeadm fact). Its
/// /usr/bin/kubeadm is a stand-in that changes nothing: a /bin/sh script (this machine's
/// /bin/sh is copied in; granted commands run chrooted in the root, as the agent runs them)
/// that appends its arguments to [`KUBEADM_CALLS`], so a test sees exactly what ran.
fn control_plane_at(root: &Path, version: &str) {
    install_programs(root, &["/bin/sh"]);
    for c in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ] {
        write(
            root,
            &format!("etc/kubernetes/manifests/{c}.yaml"),
            &format!(
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {c}\n  namespace: kube-system\nspec:\n  containers:\n  - name: {c}\n    image: registry.k8s.io/{c}:{version}\n"
            ),
        );
    }
    write(
        root,
        "var/lib/dpkg/status",
        &format!(
            "Package: kubeadm\nStatus: install ok installed\nVersion: {}-1.1\n\n",
            version.trim_start_matches('v')
        ),
    );
    write(
        root,
        "usr/bin/kubeadm",
        &format!(
            "#!/bin/sh\necho \"$*\" >> /{KUBEADM_CALLS} || true\necho \"kubeadm (stand-in): $*\"\n"
        ),
    );
    std::fs::create_dir_all(root.join(KUBEADM_CALLS).parent().unwrap()).unwrap();
    std::fs::set_permissions(
        root.join("usr/bin/kubeadm"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
}

/// The manifests cannot tell a finished `kubeadm upgrade apply` from one killed after the
/// static Pods and before its later phases (kubelet configuration, uploaded configuration,
/// the kube-proxy and CoreDNS addons). With every manifest at the target, a fresh run
/// (`resumed` false) reports no change and runs no kubeadm; a run of a step whose previous
/// attempt was interrupted (`resumed`, as the agent sets it when it re-runs one) runs
/// `kubeadm upgrade apply` / `kubeadm upgrade node` again, says why in the log, and reports
/// a change. A resumed dry run still runs only `kubeadm upgrade plan`.
#[test]
fn with_the_manifests_at_the_target_only_a_resumed_run_runs_kubeadm_again() {
    let version = "v1.34.4";
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    control_plane_at(&root, version);
    let node = Node::new(&root, &["control-plane"]);
    let plugin = node.load(&plugins().kubeadm_upgrade, "kubeadm-upgrade");
    let grants = example_grants("kubeadm-upgrade.yaml");
    let params = json!({ "kubernetesVersion": version });
    let run = |action: &str, dry_run: bool, resumed: bool| {
        let ran = node.run_with(&plugin, &grants, action, &params, dry_run, resumed);
        assert!(ran.failed_checks().is_empty(), "{:?}", ran.checks);
        ran
    };
    let calls = || std::fs::read_to_string(root.join(KUBEADM_CALLS)).unwrap_or_default();
    let logged = |ran: &Ran, text: &str| {
        ran.run
            .as_ref()
            .is_some_and(|r| r.captured.lines.iter().any(|l| l.message.contains(text)))
    };
    let why = "the previous attempt of this step was interrupted";

    // Fresh runs: nothing to do, kubeadm not run.
    let apply = run("apply", false, false);
    assert_eq!(
        apply.outcome().message,
        format!("the control plane already runs {version}; nothing to apply")
    );
    assert!(!apply.outcome().changed);
    let upgrade_node = run("node", false, false);
    assert_eq!(
        upgrade_node.outcome().message,
        format!("this control-plane node already runs {version}")
    );
    assert!(!upgrade_node.outcome().changed);
    assert_eq!(calls(), "", "a fresh run at the target runs no kubeadm");
    assert!(!logged(&apply, why) && !logged(&upgrade_node, why));

    // Resumed: kubeadm runs again, and the log says why.
    let apply = run("apply", false, true);
    let outcome = apply.outcome();
    assert_eq!(
        outcome.message,
        format!(
            "control plane at {version}: `kubeadm upgrade apply` ran again after an interrupted attempt"
        )
    );
    assert!(outcome.changed);
    assert_eq!(apply.output("version").as_deref(), Some(version));
    assert!(logged(&apply, why), "{:?}", apply.run);
    assert_eq!(calls(), format!("upgrade apply --yes {version}\n"));

    let upgrade_node = run("node", false, true);
    let outcome = upgrade_node.outcome();
    assert_eq!(
        outcome.message,
        format!("node at {version}: `kubeadm upgrade node` ran again after an interrupted attempt")
    );
    assert!(outcome.changed);
    assert!(logged(&upgrade_node, why), "{:?}", upgrade_node.run);
    assert_eq!(
        calls(),
        format!("upgrade apply --yes {version}\nupgrade node\n")
    );

    // A resumed dry run: only `kubeadm upgrade plan` (the one dry-run-safe grant) runs.
    let dry = run("apply", true, true);
    assert_eq!(
        dry.outcome().message,
        format!(
            "would run `kubeadm upgrade apply --yes {version}`; `kubeadm upgrade plan {version}` passed (its plan is in the log)"
        )
    );
    assert!(!dry.outcome().changed);
    assert!(
        plan_output(dry.outcome()).contains(&format!("kubeadm (stand-in): upgrade plan {version}")),
        "{:?}",
        dry.outcome()
    );
    // The plan could not record itself: its sandbox reads /etc/kubernetes, and a dry run
    // writes nothing.
    assert_eq!(
        calls(),
        format!("upgrade apply --yes {version}\nupgrade node\n")
    );
}

/// The `plan` output: kubeadm's own words.
fn plan_output(outcome: &bosun_host::Outcome) -> &str {
    outcome
        .outputs
        .iter()
        .find(|(k, _)| k == "plan")
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no `plan` output: {outcome:?}"))
}

/// The lab made to look like a kubeadm cluster to `kubeadm upgrade plan`, for as long as this
/// lives. kubeadm 1.34's plan needs, beyond the API server and the node's admin.conf:
/// - the `kubeadm-config` and `kubelet-config` ConfigMaps (`kubeadm init phase upload-config
///   all` with the lab's own kubeadm.yaml),
/// - CoreDNS's Deployment and ConfigMap, for its CoreDNS preflight (`init phase addon
///   coredns`; its pods stay unscheduled: no scheduler runs),
/// - the control-plane node's kube-apiserver Pod carrying kubeadm's advertise-address
///   annotation (here a mirror Pod, as the kubelet makes for a static Pod; drains leave
///   mirror Pods alone),
/// - a health-check Job that completes within 15 s: no kubelet runs, so a thread acts as
///   one for the Job's pods only, binding each to the control-plane node and reporting it
///   Succeeded (the Job controller then completes the Job).
///
/// The objects stay (every step is idempotent): other tests do not look at kube-system.
struct KubeadmCluster {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    kubelet: Option<std::thread::JoinHandle<()>>,
    /// The mirror Pod made for kubeadm, deleted again when the test ends: left in the shared
    /// lab, a never-Ready `tier=control-plane` Pod would hold every later Operation's health
    /// gates on that node (`controlPlanePods`).
    mirror: (LabPaths, String),
}

impl KubeadmCluster {
    fn prepare(lab: &bosun_lab::LabHandle, cp: &bosun_lab::LabNode) -> KubeadmCluster {
        let config = lab.state_dir.join("kubeadm.yaml");
        for phase in [&["upload-config", "all"][..], &["addon", "coredns"][..]] {
            let out = std::process::Command::new(lab.bin_dir.join("kubeadm"))
                .args(["init", "phase"])
                .args(phase)
                .arg("--config")
                .arg(&config)
                .arg("--kubeconfig")
                .arg(&lab.kubeconfig)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "kubeadm init phase {phase:?} against the lab failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": format!("kube-apiserver-{}", cp.name), "namespace": "kube-system",
                "labels": { "component": "kube-apiserver", "tier": "control-plane" },
                "annotations": {
                    "kubeadm.kubernetes.io/kube-apiserver.advertise-address.endpoint":
                        format!("{}:{}", cp.internal_ip, lab.ports.apiserver),
                    "kubernetes.io/config.mirror": "bosun-test",
                },
            },
            "spec": {
                "nodeName": cp.name,
                "containers": [{ "name": "kube-apiserver",
                    "image": format!("registry.k8s.io/kube-apiserver:{}", lab.kubernetes_version) }],
            },
        });
        // Created once (a mirror Pod's annotation cannot be added by an update).
        if let Err(e) = kubectl(
            &LabPaths::of(lab),
            &["create", "-f", "-"],
            Some(&pod.to_string()),
        ) && !e.contains("AlreadyExists")
        {
            panic!("{e}");
        }

        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let kubelet = {
            let stop = stop.clone();
            let (lab, node) = (LabPaths::of(lab), cp.name.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    complete_health_check_pods(&lab, &node);
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
            })
        };
        KubeadmCluster {
            stop,
            kubelet: Some(kubelet),
            mirror: (LabPaths::of(lab), format!("kube-apiserver-{}", cp.name)),
        }
    }
}

impl Drop for KubeadmCluster {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(k) = self.kubelet.take() {
            let _ = k.join();
        }
        let (lab, name) = &self.mirror;
        let _ = kubectl(
            lab,
            &[
                "delete",
                "pod",
                "-n",
                "kube-system",
                name,
                "--ignore-not-found",
                // No kubelet confirms a graceful deletion on the lab.
                "--grace-period=0",
                "--force",
            ],
            None,
        );
    }
}

/// What the simulated kubelet needs of the lab.
#[derive(Clone)]
struct LabPaths {
    kubectl: std::path::PathBuf,
    kubeconfig: std::path::PathBuf,
}

impl LabPaths {
    fn of(lab: &bosun_lab::LabHandle) -> LabPaths {
        LabPaths {
            kubectl: lab.bin_dir.join("kubectl"),
            kubeconfig: lab.kubeconfig.clone(),
        }
    }
}

fn kubectl(lab: &LabPaths, args: &[&str], stdin: Option<&str>) -> Result<String, String> {
    use std::io::Write as _;
    let mut child = std::process::Command::new(&lab.kubectl)
        .arg("--kubeconfig")
        .arg(&lab.kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting kubectl: {e}"))?;
    let input = stdin.unwrap_or_default().to_owned();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Binds each pending pod of kubeadm's health-check Job to `node` and reports it Succeeded,
/// as a kubelet would once its container exited 0.
fn complete_health_check_pods(lab: &LabPaths, node: &str) {
    let Ok(names) = kubectl(
        lab,
        &[
            "-n",
            "kube-system",
            "get",
            "pods",
            "-l",
            "batch.kubernetes.io/job-name",
            "-o",
            "jsonpath={range .items[?(@.status.phase==\"Pending\")]}{.metadata.name}{\"\\n\"}{end}",
        ],
        None,
    ) else {
        return;
    };
    for pod in names
        .lines()
        .filter(|n| n.starts_with("upgrade-health-check"))
    {
        let binding = json!({
            "apiVersion": "v1", "kind": "Binding", "metadata": { "name": pod },
            "target": { "apiVersion": "v1", "kind": "Node", "name": node },
        });
        let _ = kubectl(
            lab,
            &[
                "create",
                "--raw",
                &format!("/api/v1/namespaces/kube-system/pods/{pod}/binding"),
                "-f",
                "-",
            ],
            Some(&binding.to_string()),
        );
        let status = json!({ "status": { "phase": "Succeeded", "containerStatuses": [{
            "name": "upgrade-health-check", "image": "registry.k8s.io/pause", "imageID": "",
            "ready": false, "restartCount": 0,
            "state": { "terminated": { "exitCode": 0, "reason": "Completed" } } }] } });
        let _ = kubectl(
            lab,
            &[
                "-n",
                "kube-system",
                "patch",
                "pod",
                pod,
                "--subresource=status",
                "--type=merge",
                "-p",
                &status.to_string(),
            ],
            None,
        );
    }
}
