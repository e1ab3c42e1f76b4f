//! The conformance kit (runtime/conformance) on the first-party plugins the kit tests in
//! conformance.rs do not cover: `reboot`, `etcd`, `kubeadm-upgrade` and `certs`, each with
//! the grants its example ships, on node roots built as the plugin's own tests build them.
//! Where the kit finds something in a plugin, the test asserts that finding (and says why)
//! instead of passing.

use std::path::Path;
use std::time::Duration;

use bosun_conformance::{Case, Status};
use bosun_plugins_tests::{example_grants, plugins, utc_now, write};
use serde_json::json;

use crate::conformance::{
    EVERY_CHECK, EVERY_CHECK_BUT_OUTPUTS, assert_passed, case, check, failures, kit_for, root,
};

const DEBIAN_OS: &str = "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\nVERSION_ID=\"12\"\nID=debian\n";

/// `reboot` with its one service grant (start reboot.target), which the kit's recording
/// stand-in for systemd answers. Its preflight refuses only a node whose systemd does not
/// know reboot.target: the stand-in knows every unit and starts none at first, so there is
/// no unsupported root to give it.
///
/// The stand-in keeps reboot.target active/running after the first run's start, as a real
/// node's systemd does while it goes down: the second run must find the reboot under way,
/// ask for nothing and report no change. (The kit first found that the plugin's preflight
/// refused that node, so an interrupted step re-run by the agent blocked its task.)
#[test]
fn reboot_under_the_kit() {
    let dir = tempfile::tempdir().unwrap();
    let debian = dir.path().join("debian");
    write(&debian, "etc/os-release", DEBIAN_OS);
    let grants = example_grants("reboot.yaml");
    let mut kit = kit_for(&plugins().reboot, "reboot", grants, &["worker"], dir.path());
    kit.roots = vec![root("debian", &debian, false)];
    kit.cases = vec![case("reboot", json!({}), &[])];
    let report = bosun_conformance::run(&kit).unwrap();
    let text = bosun_conformance::text(&report);
    println!("{text}");
    assert_passed(&report, "debian", "reboot", &EVERY_CHECK_BUT_OUTPUTS);
    assert!(
        check(&report, "debian", "reboot", "run")
            .message
            .contains("reboot of kit-node asked for: reboot.target is active/running"),
        "{text}"
    );
    assert!(
        check(&report, "debian", "reboot", "idempotent")
            .message
            .contains("reboot of kit-node already under way: reboot.target is active/running; nothing asked again"),
        "{text}"
    );
    let (failed, unused) = failures(&report);
    assert!(failed.is_empty(), "{text}");
    assert!(unused.is_empty(), "{text}");
    assert_eq!(report.grants.len(), 1, "{text}");
    assert!(report.passed(), "{text}");
}

const ETCD_MEMBERS: [&str; 3] = ["cp1@10.0.0.1", "cp2@10.0.0.2", "cp3@10.0.0.3"];

/// `etcd` with the grants its example ships, on a control plane whose etcdctl and etcdutl
/// are simulated as etcd.rs simulates them (three healthy members, kubeadm's etcd manifest,
/// the snapshot directory created), and on a node without kubeadm's etcd (no manifest: an
/// external etcd, or a worker), which preflight refuses.
///
/// The simulated `etcdctl snapshot save` is made to take a little over a second, as a real
/// one does: the snapshot's file name carries the time to the second, so a second run that
/// saved again (as the plugin did before, which the kit found) would write another file
/// whatever the second.
///
/// `snapshot` with a label is idempotent: the second run finds the snapshot the first took
/// with that label, verifies it again and reports it unchanged, saving and removing
/// nothing. Every check and every grant passes.
#[test]
fn etcd_under_the_kit() {
    let dir = tempfile::tempdir().unwrap();
    let cp = dir.path().join("control-plane");
    write(&cp, "etc/os-release", DEBIAN_OS);
    let _etcd = bosun_plugins_tests::simulated_etcd(&cp, &ETCD_MEMBERS, &[]);
    std::fs::create_dir_all(cp.join("var/lib/etcd-snapshots")).unwrap();
    bosun_plugins_tests::install_programs(&cp, &["/usr/bin/sleep"]);
    let etcdctl = cp.join("usr/local/bin/etcdctl");
    let script = std::fs::read_to_string(&etcdctl).unwrap();
    let slow = script.replace(
        "\"snapshot save\") printf",
        "\"snapshot save\") /usr/bin/sleep 1.2 && printf",
    );
    assert_ne!(
        script, slow,
        "the simulated etcdctl's snapshot save was found"
    );
    std::fs::write(&etcdctl, slow).unwrap();
    // A node without kubeadm's etcd: the same root without its etcd manifest.
    let no_etcd = dir.path().join("no-etcd");
    bosun_plugins_tests::copy_tree(&cp, &no_etcd);
    std::fs::remove_file(no_etcd.join("etc/kubernetes/manifests/etcd.yaml")).unwrap();

    let grants = example_grants("etcd.yaml");
    let mut kit = kit_for(
        &plugins().etcd,
        "etcd",
        grants,
        &["control-plane"],
        dir.path(),
    );
    kit.roots = vec![
        root("control-plane", &cp, false),
        root("no-etcd", &no_etcd, true),
    ];
    kit.cases = vec![
        Case {
            outputs_schema: Some(json!({
                "required": ["members", "leader", "versions"],
                "properties": {
                    "members": {"const": "3"},
                    "leader": {"const": "cp1 (https://10.0.0.1:2379)"},
                    "versions": {"const": "3.6.5"}
                },
                "additionalProperties": false
            })),
            ..case(
                "health",
                json!({"expectedMembers": 3, "waitSeconds": 0}),
                &[],
            )
        },
        Case {
            outputs_schema: Some(json!({
                "required": ["path", "sizeBytes", "revision", "totalKeys", "etcdHash", "sha256", "kept"],
                "properties": {
                    "path": {"pattern": "^/var/lib/etcd-snapshots/etcd-[0-9]{8}T[0-9]{6}Z-kit\\.db$"},
                    "revision": {"const": "42"},
                    "totalKeys": {"const": "7"},
                    "sha256": {"pattern": "^[0-9a-f]{64}$"},
                    "sizeBytes": {"pattern": "^[1-9][0-9]*$"},
                    "etcdHash": {"pattern": "^[0-9a-f]{8}$"},
                    "kept": {"pattern": "^etcd-[0-9]{8}T[0-9]{6}Z-kit\\.db$"}
                },
                "additionalProperties": false
            })),
            ..case("snapshot", json!({"keep": 1, "label": "kit"}), &[])
        },
    ];
    let report = bosun_conformance::run(&kit).unwrap();
    let text = bosun_conformance::text(&report);
    println!("{text}");
    for action in ["health", "snapshot"] {
        assert_passed(&report, "control-plane", action, &EVERY_CHECK);
        let refused = check(&report, "no-etcd", action, "preflight-refuses");
        assert_eq!(refused.status, Status::Pass, "{text}");
        assert!(
            refused
                .message
                .contains("kubeadm runs no etcd on this node"),
            "{text}"
        );
    }
    assert!(
        check(&report, "control-plane", "snapshot", "run")
            .message
            .starts_with("changed; 1 path(s) changed: etcd snapshot /var/lib/etcd-snapshots/etcd-"),
        "{text}"
    );
    let again = check(&report, "control-plane", "snapshot", "idempotent");
    assert!(
        again.message.starts_with(
            "the second run changed nothing: etcd snapshot /var/lib/etcd-snapshots/etcd-"
        ) && again
            .message
            .contains("-kit.db was already taken with label `kit`: "),
        "{text}"
    );
    let (failed, unused) = failures(&report);
    assert!(failed.is_empty(), "{text}");
    assert!(unused.is_empty(), "{text}");
    assert_eq!(report.grants.len(), 8, "{text}");
    assert!(report.passed(), "{text}");
}

/// The version every `kubeadm-upgrade` case upgrades to, and the stand-in kubeadm's own.
const KUBEADM_TARGET: &str = "v1.34.4";

/// A node root for `kubeadm-upgrade`, as kubeadm_upgrade.rs builds one without the lab: the
/// three static Pod manifests at `control_plane` (none when `None`), a dpkg database saying
/// kubeadm [`KUBEADM_TARGET`] is installed (the host's kubeadm fact), and /usr/bin/kubeadm a
/// stand-in (a /bin/sh script of shell builtins, run chrooted as the agent runs it) that
/// does what kubeadm does to the node, no more: `upgrade plan` prints a plan and writes
/// nothing; `upgrade apply --yes V` writes the three manifests at V; `upgrade node` moves
/// the manifests that exist to its own version; both write the kubelet's configuration.
fn kubeadm_node(root: &Path, control_plane: Option<&str>) {
    write(root, "etc/os-release", DEBIAN_OS);
    bosun_plugins_tests::install_programs(root, &["/bin/sh", "/usr/bin/sha256sum"]);
    const COMPONENTS: [&str; 3] = [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ];
    let manifest = |c: &str, v: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {c}\n  namespace: kube-system\nspec:\n  containers:\n  - name: {c}\n    image: registry.k8s.io/{c}:{v}\n"
        )
    };
    std::fs::create_dir_all(root.join("etc/kubernetes/manifests")).unwrap();
    if let Some(v) = control_plane {
        for c in COMPONENTS {
            write(
                root,
                &format!("etc/kubernetes/manifests/{c}.yaml"),
                &manifest(c, v),
            );
        }
    }
    std::fs::create_dir_all(root.join("var/lib/kubelet")).unwrap();
    write(
        root,
        "var/lib/dpkg/status",
        &format!(
            "Package: kubeadm\nStatus: install ok installed\nVersion: {}-1.1\n\n",
            KUBEADM_TARGET.trim_start_matches('v')
        ),
    );
    let pod = manifest("$c", "$v").replace('\n', "\\n");
    write(
        root,
        "usr/bin/kubeadm",
        &format!(
            r#"#!/bin/sh
# kubeadm {KUBEADM_TARGET} (a stand-in for the Bosun tests): what it does to the node.
own={KUBEADM_TARGET}
pods() {{
  v=$1; only_existing=$2
  for c in {components}; do
    f=/etc/kubernetes/manifests/$c.yaml
    if [ -e "$f" ] || [ -z "$only_existing" ]; then printf "{pod}" > "$f" || exit 1; fi
  done
  printf 'kind: KubeletConfiguration\n# written by kubeadm %s\n' "$own" > /var/lib/kubelet/config.yaml || exit 1
}}
case "$1 $2" in
"upgrade plan") echo "[upgrade/versions] kubeadm version: $own"; echo "[upgrade/versions] Target version: $3" ;;
"upgrade apply") pods "$4" "" && echo "[upgrade] SUCCESS! The cluster was upgraded to \"$4\"." ;;
"upgrade node") pods "$own" yes && echo "[upgrade] The configuration for this node was successfully upgraded!" ;;
*) echo "kubeadm (stand-in): unexpected $*" >&2; exit 2 ;;
esac
"#,
            components = COMPONENTS.join(" "),
        ),
    );
    std::fs::set_permissions(
        root.join("usr/bin/kubeadm"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
}

/// `kubeadm-upgrade` with the grants its example ships (not the lab's: the stand-in kubeadm
/// reaches no API server), for a control-plane node, on:
/// - `control-plane`: its control plane at v1.34.1, one patch behind: plan, apply and node
///   run, and a second run finds every manifest at the target and changes nothing;
/// - `no-static-pods`: no static Pod manifests (what a worker looks like to the plugin; the
///   kit's node context, a control plane, is one for every root): plan and node run;
/// - `two-minors-behind` (unsupported): at v1.32.9, which every action refuses (kubeadm
///   upgrades one minor version at a time);
/// - `no-apiserver` (unsupported, the same files as `no-static-pods`): `apply` refuses a
///   node without the API server's manifest.
///
/// Every check passes and every grant is used. On a node without static Pods, `node` runs
/// `kubeadm upgrade node` on every run and tells from the kubelet configuration's hash
/// whether it changed the node: the second run reports no change. (The kit first found
/// that it reported "node upgraded" every time.) The stand-in does not write the backup of
/// the kubelet configuration a real kubeadm keeps in /etc/kubernetes/tmp on every run.
#[test]
fn kubeadm_upgrade_under_the_kit() {
    let dir = tempfile::tempdir().unwrap();
    let cp = dir.path().join("control-plane");
    kubeadm_node(&cp, Some("v1.34.1"));
    let old = dir.path().join("two-minors-behind");
    kubeadm_node(&old, Some("v1.32.9"));
    let bare = dir.path().join("no-static-pods");
    kubeadm_node(&bare, None);

    let grants = example_grants("kubeadm-upgrade.yaml");
    let mut kit = kit_for(
        &plugins().kubeadm_upgrade,
        "kubeadm-upgrade",
        grants,
        &["control-plane"],
        dir.path(),
    );
    kit.roots = vec![
        root("control-plane", &cp, false),
        root("no-static-pods", &bare, false),
        root("two-minors-behind", &old, true),
        root("no-apiserver", &bare, true),
    ];
    let params = json!({ "kubernetesVersion": KUBEADM_TARGET });
    let version = json!({
        "required": ["version"],
        "properties": {"version": {"const": KUBEADM_TARGET}},
        "additionalProperties": false
    });
    kit.cases = vec![
        Case {
            outputs_schema: Some(json!({
                "required": ["plan"],
                "properties": {"plan": {"pattern": "Target version: v1\\.34\\.4"}},
                "additionalProperties": false
            })),
            ..case(
                "plan",
                params.clone(),
                &["control-plane", "no-static-pods", "two-minors-behind"],
            )
        },
        Case {
            outputs_schema: Some(version.clone()),
            ..case(
                "apply",
                params.clone(),
                &["control-plane", "two-minors-behind", "no-apiserver"],
            )
        },
        Case {
            outputs_schema: Some(version),
            ..case(
                "node",
                params,
                &["control-plane", "no-static-pods", "two-minors-behind"],
            )
        },
    ];
    let report = bosun_conformance::run(&kit).unwrap();
    let text = bosun_conformance::text(&report);
    println!("{text}");
    for (root, action) in [
        ("control-plane", "plan"),
        ("control-plane", "apply"),
        ("control-plane", "node"),
        ("no-static-pods", "plan"),
        ("no-static-pods", "node"),
    ] {
        assert_passed(&report, root, action, &EVERY_CHECK);
    }
    assert!(
        check(&report, "control-plane", "apply", "run")
            .message
            .starts_with("changed; 4 path(s) changed: control plane upgraded to v1.34.4"),
        "{text}"
    );
    assert!(
        check(&report, "control-plane", "apply", "idempotent")
            .message
            .contains("the control plane already runs v1.34.4; nothing to apply"),
        "{text}"
    );
    for action in ["plan", "apply", "node"] {
        let refused = check(&report, "two-minors-behind", action, "preflight-refuses");
        assert_eq!(refused.status, Status::Pass, "{text}");
        assert!(refused.message.contains("skips a minor version"), "{text}");
    }
    let refused = check(&report, "no-apiserver", "apply", "preflight-refuses");
    assert_eq!(refused.status, Status::Pass, "{text}");
    assert!(
        refused
            .message
            .contains("/etc/kubernetes/manifests/kube-apiserver.yaml must exist"),
        "{text}"
    );
    assert!(
        check(&report, "no-static-pods", "node", "idempotent")
            .message
            .contains(
                "`kubeadm upgrade node` left the kubelet's configuration and flags as they were"
            ),
        "{text}"
    );
    let (failed, unused) = failures(&report);
    assert!(failed.is_empty(), "{text}");
    assert!(unused.is_empty(), "{text}");
    assert_eq!(report.grants.len(), 5, "{text}");
    assert!(report.passed(), "{text}");
}

/// `certs` with the grants its example ships (with the lab's API server port beside 6443,
/// as certs.rs runs it), on a copy of the lab's control-plane root (the PKI, kubeconfigs,
/// static Pod manifests and kubeadm configuration the real kubeadm made, and the real
/// kubeadm), as certs.rs builds it, and on a worker made from it as `kubeadm join` leaves
/// one (kubelet.conf, the cluster CA's certificate, an empty manifest directory), which
/// `renew` (no CA key) and `restart-control-plane` (no static Pod) refuse. `check` refuses
/// nothing in preflight (it fails in its run on a node without certificates), so it runs
/// on the control plane only.
///
/// Cases: `check`; `renew` of every certificate issued before now (as the planner asks
/// without `renewBefore`, with the Operation's creation time); `renew` of the certificates
/// due within 720h (none on a fresh PKI); `renew` of one certificate with the node's kubeadm
/// configuration (`--config`, the second kubeadm grant); `restart-control-plane`, a restart
/// by design, with a 1 s wait.
///
/// Every check passes and every grant is used. (The kit first found that `renew` without
/// `renewBefore` renewed everything again on every run; `issuedBefore` is the fix.)
#[test]
fn certs_under_the_kit() {
    let (lab, cp) = bosun_plugins_tests::lab_control_plane();
    let dir = tempfile::tempdir().unwrap();
    let control_plane = dir.path().join("control-plane");
    bosun_plugins_tests::copy_tree(&cp.host_root, &control_plane);
    bosun_plugins_tests::install_programs(&control_plane, &["/usr/bin/df"]);
    assert!(
        control_plane
            .join("etc/kubernetes/kubeadm-config.yaml")
            .is_file(),
        "the lab's control plane keeps its kubeadm configuration"
    );
    let worker = dir.path().join("worker");
    bosun_plugins_tests::copy_tree(&control_plane, &worker);
    let k8s = worker.join("etc/kubernetes");
    for entry in std::fs::read_dir(k8s.join("pki")).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap() != "ca.crt" {
            let _ = std::fs::remove_file(&path).or_else(|_| std::fs::remove_dir_all(&path));
        }
    }
    for entry in std::fs::read_dir(&k8s).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_file() && name != "kubelet.conf" {
            std::fs::remove_file(&path).unwrap();
        }
    }
    for entry in std::fs::read_dir(k8s.join("manifests")).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
    }

    let grants = bosun_plugins_tests::example_grants_for_lab("certs.yaml", lab.ports);
    let mut kit = kit_for(
        &plugins().certs,
        "certs",
        grants,
        &["control-plane"],
        dir.path(),
    );
    kit.roots = vec![
        root("control-plane", &control_plane, false),
        root("worker", &worker, true),
    ];
    let both = &["control-plane", "worker"][..];
    kit.cases = vec![
        Case {
            outputs_schema: Some(json!({
                "required": ["apiserver", "admin.conf", "etcd-server"],
                "minProperties": 11,
                "additionalProperties": {"pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$"}
            })),
            ..case("check", json!({}), &["control-plane"])
        },
        Case {
            name: "renew-all".into(),
            ..case(
                "renew",
                json!({"certificates": ["all"], "issuedBefore": utc_now()}),
                both,
            )
        },
        Case {
            name: "renew-if-due".into(),
            ..case(
                "renew",
                json!({"certificates": ["all"], "renewBefore": "720h"}),
                both,
            )
        },
        Case {
            name: "renew-with-config".into(),
            outputs_schema: Some(json!({
                "required": ["apiserver.before", "apiserver.after"],
                "additionalProperties": false,
                "properties": {
                    "apiserver.before": {"type": "string"},
                    "apiserver.after": {"type": "string"}
                }
            })),
            ..case(
                "renew",
                json!({"certificates": ["apiserver"], "config": "/etc/kubernetes/kubeadm-config.yaml", "issuedBefore": utc_now()}),
                both,
            )
        },
        Case {
            // A restart by design: a change on every run.
            changes_every_run: true,
            outputs_schema: Some(json!({
                "required": ["restarted"],
                "properties": {"restarted": {"const": "etcd,kube-apiserver,kube-controller-manager,kube-scheduler"}}
            })),
            ..case("restart-control-plane", json!({"waitSeconds": 1}), both)
        },
    ];
    // kubeadm without `--config` reads the cluster's configuration first, and against the
    // lab that takes it about a minute before it falls back to its defaults (measured: 61 s
    // for `kubeadm certs renew all` chrooted into a copy of the root, outside any sandbox).
    // The step's deadline in an Operation is stepTimeoutSeconds, 1800 by default; the
    // kubeadm grant's own timeout is 120 s. 600 s, as the certs.rs runs allow.
    kit.deadline = Duration::from_secs(600);
    let report = bosun_conformance::run(&kit).unwrap();
    let text = bosun_conformance::text(&report);
    println!("{text}");
    for case in [
        "check",
        "renew-all",
        "renew-if-due",
        "renew-with-config",
        "restart-control-plane",
    ] {
        for name in EVERY_CHECK {
            let c = check(&report, "control-plane", case, name);
            // renew-if-due and renew-all declare no outputs schema.
            let want = if name == "outputs-match-schema"
                && case.starts_with("renew-")
                && case != "renew-with-config"
            {
                Status::Skip
            } else {
                Status::Pass
            };
            assert_eq!(c.status, want, "{case} {name}: {text}");
        }
    }
    for case in ["renew-all", "renew-if-due", "renew-with-config"] {
        let refused = check(&report, "worker", case, "preflight-refuses");
        assert_eq!(refused.status, Status::Pass, "{text}");
        assert!(
            refused
                .message
                .contains("ca-key: none of the selected certificates exists"),
            "{text}"
        );
    }
    let refused = check(
        &report,
        "worker",
        "restart-control-plane",
        "preflight-refuses",
    );
    assert_eq!(refused.status, Status::Pass, "{text}");
    assert!(
        refused.message.contains("manifests-present: none of"),
        "{text}"
    );
    assert!(
        check(
            &report,
            "control-plane",
            "restart-control-plane",
            "idempotent"
        )
        .message
        .starts_with("the second run left the root as the first did"),
        "{text}"
    );
    // Each renewal renews on its first run and renews nothing more on its second.
    for (case, renewed) in [
        ("renew-all", "renewed 11 certificate(s)"),
        ("renew-with-config", "renewed 1 certificate(s)"),
    ] {
        assert!(
            {
                let run = &check(&report, "control-plane", case, "run").message;
                run.starts_with("changed; ")
                    && run.contains(&format!(" path(s) changed: {renewed}"))
            },
            "{text}"
        );
        assert!(
            check(&report, "control-plane", case, "idempotent")
                .message
                .contains("(renewed already); nothing to renew"),
            "{text}"
        );
    }
    let (failed, unused) = failures(&report);
    assert!(failed.is_empty(), "{text}");
    assert!(unused.is_empty(), "{text}");
    assert_eq!(report.grants.len(), 5, "{text}");
    assert!(report.passed(), "{text}");
}
