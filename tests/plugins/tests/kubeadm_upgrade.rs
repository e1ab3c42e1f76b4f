//! The `kubeadm-upgrade` plugin against a copy of a lab control-plane node root (the real
//! kubeadm v1.34.4 and kubeadm-made manifests), through the real sandbox with the grants
//! of deploy/examples/plugins/kubeadm-upgrade.yaml. `apply` and `node` are run for real
//! only where they are no-ops or dry runs: a real `kubeadm upgrade apply` would change the
//! lab's shared cluster.

use bosun_plugins_tests::{Node, Ran, copy_tree, example_grants, plugins};
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
    let grants = example_grants("kubeadm-upgrade.yaml");
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
    // API server (the copy's admin.conf points there). The lab has no CoreDNS, which
    // kubeadm's own preflight refuses; the plugin reports kubeadm's words. `plan`'s success
    // path is not tested here: past CoreDNS (a `coredns` Deployment and ConfigMap in
    // kube-system), kubeadm 1.34 also needs the `kubeadm-config` and `kubelet-config`
    // ConfigMaps (`init phase upload-config`) and a kube-apiserver Pod on the node carrying
    // kubeadm's advertise-address annotation, none of which the shared lab has (tried by
    // hand against the lab, 2026-12-01); adding them would change kube-system for every
    // other test.
    let plan = run("plan", &version, false);
    let e = plan.error();
    assert_eq!(e.code, "command-failed", "{}", e.message);
    assert!(
        e.message
            .contains(&format!("/usr/bin/kubeadm upgrade plan {version}")),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("preflight checks failed"),
        "{}",
        e.message
    );

    // One minor behind: the step to the lab's version is allowed, and with kubeadm at the
    // target the dry run runs `kubeadm upgrade plan` (the one kubeadm command its grant
    // marks `dryRun`) and reports what kubeadm says: here its own preflight refuses (the
    // lab has no CoreDNS), which the real `apply` would hit too.
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
    let e = dry.error();
    assert_eq!(e.code, "command-failed", "{}", e.message);
    assert!(
        e.message
            .contains(&format!("/usr/bin/kubeadm upgrade plan {version}"))
            && e.message.contains("preflight checks failed"),
        "{}",
        e.message
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
