//! The community zypper plugin (plugins/community/zypper, written from docs/plugins.md with
//! the public SDK only) with the grants its manifest ships, against an openSUSE Leap node
//! root holding the real zypper and rpm, and a local rpm-md repository made by createrepo_c
//! with kubeadm, kubelet and kubectl at two versions each. Then the conformance kit over it:
//! a fresh Leap root, a Leap root with kubeadm installed and locked, and a Debian root it
//! must refuse.

use std::path::Path;
use std::time::Duration;

use bosun_api::grants::{Access, CommandPath, Grants};
use bosun_conformance::{Case, Kit, Root, Status};
use bosun_host::{ExecIsolation, HostConfig, NodeContext, PluginPin};
use bosun_plugins_tests::{
    Node, build_rpm, grants_of, index_rpm_repo, plugins, rpm_version, suse_root, workspace_root,
    write,
};
use bosun_trust::{Digest, SigningKey, Statement, TrustRoots};
use serde_json::json;

const PACKAGES: [&str; 3] = ["kubeadm", "kubelet", "kubectl"];
const RELEASE: &str = "150500.1.1";

/// A Leap root whose repository has every package at 1.34.3 and 1.34.4.
fn leap(root: &Path) {
    suse_root(root);
    for p in PACKAGES {
        for v in ["1.34.3", "1.34.4"] {
            build_rpm(root, p, v, RELEASE);
        }
    }
    index_rpm_repo(root);
}

/// The manifest's grants, with zypper also reading the local repository.
fn grants() -> Grants {
    let mut g = grants_of(&workspace_root().join("plugins/community/zypper/zypper.yaml"));
    for e in &mut g.exec {
        if e.command == "/usr/bin/zypper" {
            e.sandbox.filesystem.push(CommandPath {
                path: "/srv/repo".into(),
                access: Access::ReadOnly,
                execute: false,
                optional: false,
                writable_in_dry_run: false,
            });
        }
    }
    g
}

fn locks(root: &Path) -> String {
    std::fs::read_to_string(root.join("etc/zypp/locks")).unwrap_or_default()
}

fn debian(root: &Path) {
    write(
        root,
        "etc/os-release",
        "ID=debian\nVERSION_ID=12\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n",
    );
}

#[test]
fn zypper_installs_pinned_versions_locks_them_and_upgrades_through_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("leap");
    leap(&root);
    let node = Node::new(&root, &["worker"]);
    let zypper = node.load(&plugins().zypper, "zypper");
    let grants = grants();
    let all = json!({"packages": PACKAGES, "kubernetesVersion": "v1.34.3"});

    let dry = node.run(&zypper, &grants, "install", &all, true);
    assert_eq!(
        dry.outcome().message,
        "would refresh the repositories and install the newest 1.34.3-* of kubeadm, kubelet, kubectl with zypper, \
         locked (now kubeadm not installed, kubelet not installed, kubectl not installed)"
    );
    assert_eq!(rpm_version(&root, "kubeadm"), None);

    let first = node.run(&zypper, &grants, "install", &all, false);
    let o = first.outcome();
    assert!(o.changed, "{}", o.message);
    assert_eq!(
        o.message,
        "zypper: kubeadm 1.34.3-150500.1.1, kubelet 1.34.3-150500.1.1, kubectl 1.34.3-150500.1.1, locked"
    );
    assert_eq!(first.output("kubelet.before").unwrap(), "none");
    for p in PACKAGES {
        assert_eq!(rpm_version(&root, p).unwrap(), "1.34.3-150500.1.1");
        assert!(
            locks(&root).contains(&format!("solvable_name: {p}")),
            "{}",
            locks(&root)
        );
    }

    let again = node.run(&zypper, &grants, "install", &all, false);
    assert!(!again.outcome().changed, "{}", again.outcome().message);

    // Upgrade through the lock: lifted for the install, set again after.
    let up = node.run(
        &zypper,
        &grants,
        "install",
        &json!({"packages": ["kubeadm"], "kubernetesVersion": "v1.34.4"}),
        false,
    );
    assert!(up.outcome().changed);
    assert_eq!(up.output("kubeadm.before").unwrap(), "1.34.3-150500.1.1");
    assert_eq!(rpm_version(&root, "kubeadm").unwrap(), "1.34.4-150500.1.1");
    assert_eq!(rpm_version(&root, "kubelet").unwrap(), "1.34.3-150500.1.1");
    assert!(locks(&root).contains("solvable_name: kubeadm"));

    let missing = node.run(
        &zypper,
        &grants,
        "install",
        &json!({"packages": ["kubeadm"], "kubernetesVersion": "v1.35.0"}),
        false,
    );
    let e = missing.error();
    assert_eq!(e.code, "version-not-available");
    assert!(
        e.message.contains("1.34.4-150500.1.1, 1.34.3-150500.1.1"),
        "{}",
        e.message
    );

    let unhold = node.run(
        &zypper,
        &grants,
        "unhold",
        &json!({"packages": ["kubeadm"]}),
        false,
    );
    assert!(unhold.outcome().changed);
    assert!(!locks(&root).contains("solvable_name: kubeadm"));
    assert!(locks(&root).contains("solvable_name: kubelet"));

    // Not a SUSE family: preflight refuses, naming what it serves.
    let other = dir.path().join("debian");
    debian(&other);
    let node = Node::new(&other, &["worker"]);
    let zypper = node.load(&plugins().zypper, "zypper");
    let refused = node.run(&zypper, &grants, "install", &all, false);
    let (name, message) = &refused.failed_checks()[0];
    assert_eq!(name, "os-family");
    assert!(
        message.contains("is not a SUSE family: this plugin serves opensuse-leap, opensuse-tumbleweed, sles, suse"),
        "{message}"
    );
}

#[test]
fn zypper_passes_the_conformance_kit() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = dir.path().join("leap");
    leap(&fresh);
    let locked = dir.path().join("leap-locked");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(&fresh)
        .arg(&locked)
        .status()
        .unwrap();
    assert!(status.success());
    {
        let node = Node::new(&locked, &["worker"]);
        let zypper = node.load(&plugins().zypper, "zypper");
        let ran = node.run(
            &zypper,
            &grants(),
            "install",
            &json!({"packages": ["kubeadm"], "kubernetesVersion": "v1.34.3"}),
            false,
        );
        assert!(ran.outcome().changed);
    }
    let other = dir.path().join("debian");
    debian(&other);

    // Signed by the community publisher's own key.
    let key = SigningKey::generate_ed25519();
    let mut trust = TrustRoots::new();
    trust
        .add_pem(&key.public_key().to_pem(), "community.pub")
        .unwrap();
    let bytes = plugins().zypper.clone();
    let digest = Digest::of(&bytes);
    let statement = Statement::new("zypper", "0.1.0", digest).unwrap();
    let mut host = HostConfig::new(dir.path(), trust);
    host.exec_isolation = ExecIsolation::Chroot;
    let case = |action: &str, params: serde_json::Value, roots: &[&str]| Case {
        name: format!("{action} {}", params["packages"]),
        action: action.into(),
        params,
        outputs_schema: None,
        changes_every_run: false,
        roots: roots.iter().map(|r| (*r).to_owned()).collect(),
    };
    let v = "v1.34.4";
    let mut install_all = case(
        "install",
        json!({"packages": PACKAGES, "kubernetesVersion": v, "hold": false}),
        &["leap", "debian"],
    );
    install_all.outputs_schema = Some(json!({
        "required": ["kubeadm.before", "kubeadm.after", "kubelet.after", "kubectl.after"],
        "properties": {"kubeadm.after": {"pattern": "^1\\.34\\.4-"}}
    }));
    let kit = Kit {
        host,
        plugin: bytes,
        pin: PluginPin {
            name: "zypper".into(),
            version: "0.1.0".into(),
            sha256: digest,
            signatures: vec![key.sign_statement(&statement)],
        },
        grants: grants(),
        node: NodeContext {
            node_name: "kit-node".into(),
            roles: vec!["worker".into()],
            kubelet_version: Some("v1.34.3".into()),
        },
        deadline: Duration::from_secs(300),
        max_use: 0.75,
        // zypper's logs and metadata caches change on every call, and it writes its list of
        // automatically installed packages (empty here) whenever it loads the system: not
        // the node's packages.
        ignore: vec![
            "/var/log".into(),
            "/var/cache/zypp".into(),
            "/var/lib/zypp/AutoInstalled".into(),
        ],
        roots: vec![
            Root {
                name: "leap".into(),
                template: fresh,
                unsupported: false,
            },
            Root {
                name: "leap-locked".into(),
                template: locked,
                unsupported: false,
            },
            Root {
                name: "debian".into(),
                template: other,
                unsupported: true,
            },
        ],
        cases: vec![
            case(
                "install",
                json!({"packages": ["kubeadm"], "kubernetesVersion": v}),
                &["leap", "leap-locked", "debian"],
            ),
            case(
                "install",
                json!({"packages": ["kubelet", "kubectl"], "kubernetesVersion": v}),
                &["leap", "debian"],
            ),
            install_all,
            case(
                "hold",
                json!({"packages": ["kubeadm"]}),
                &["leap-locked", "debian"],
            ),
            case(
                "unhold",
                json!({"packages": ["kubeadm"]}),
                &["leap-locked", "debian"],
            ),
        ],
        work_dir: dir.path().join("work"),
    };
    let report = bosun_conformance::run(&kit).unwrap();
    let text = bosun_conformance::text(&report);
    println!("{text}");
    assert!(report.passed(), "{text}");
    assert!(
        report
            .checks
            .iter()
            .filter(|c| c.root == "debian")
            .all(|c| c.check == "preflight-refuses" && c.status == Status::Pass),
        "{text}"
    );
    assert_eq!(report.grants.len(), 9, "{text}");
}
