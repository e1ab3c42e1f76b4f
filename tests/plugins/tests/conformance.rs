//! The conformance kit (`kubectl bosun plugin test`, runtime/conformance) on real plugins
//! and node roots: the `hello` example passes it with the grants its example ships, and
//! the kit catches what it exists to catch, on a plugin that does it (the steps test
//! plugin's `append`, declared idempotent, appends a line on every run), a grant no case
//! uses and an action with no case.

use std::path::Path;
use std::time::Duration;

use bosun_api::grants::{Access, FilesystemGrant, Grants};
use bosun_conformance::{Case, Kit, Report, Root, Status};
use bosun_host::{ExecIsolation, HostConfig, NodeContext, PluginPin};
use bosun_plugins_tests::{grants_of, install_programs, is_root, plugins, workspace_root, write};
use bosun_trust::{Digest, SigningKey, Statement, TrustRoots};
use serde_json::json;

/// A kit for `bytes`, signed as `name` by a fresh key its host trusts.
fn kit(bytes: &[u8], name: &str, grants: Grants, work: &Path) -> Kit {
    assert!(
        is_root(),
        "the kit chroots granted commands into the roots: run as root"
    );
    let key = SigningKey::generate_ed25519();
    let mut roots = TrustRoots::new();
    roots
        .add_pem(&key.public_key().to_pem(), "kit.pub")
        .unwrap();
    let digest = Digest::of(bytes);
    let statement = Statement::new(name, env!("CARGO_PKG_VERSION"), digest).unwrap();
    let mut host = HostConfig::new(work, roots);
    host.exec_isolation = ExecIsolation::Chroot;
    Kit {
        host,
        plugin: bytes.to_vec(),
        pin: PluginPin {
            name: name.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            sha256: digest,
            signatures: vec![key.sign_statement(&statement)],
        },
        grants,
        node: NodeContext {
            node_name: "kit-node".into(),
            roles: vec!["worker".into()],
            kubelet_version: Some("v1.34.4".into()),
        },
        deadline: Duration::from_secs(60),
        max_use: 0.75,
        ignore: Vec::new(),
        roots: Vec::new(),
        cases: Vec::new(),
        work_dir: work.join("work"),
    }
}

/// A node root with an os-release (a regular file, or the usual symlink into /usr/lib) and
/// the machine's `uname`.
fn os_root(dir: &Path, pretty: &str, id: &str, symlink: bool) {
    let text = format!("PRETTY_NAME=\"{pretty}\"\nID={id}\n");
    if symlink {
        write(dir, "usr/lib/os-release", &text);
        std::fs::create_dir_all(dir.join("etc")).unwrap();
        std::os::unix::fs::symlink("../usr/lib/os-release", dir.join("etc/os-release")).unwrap();
    } else {
        write(dir, "etc/os-release", &text);
    }
    install_programs(dir, &["/usr/bin/uname"]);
}

fn check<'r>(
    report: &'r Report,
    root: &str,
    case: &str,
    check: &str,
) -> &'r bosun_conformance::CheckResult {
    report
        .checks
        .iter()
        .find(|c| c.root == root && c.case == case && c.check == check)
        .unwrap_or_else(|| {
            panic!(
                "no check {root}/{case}/{check} in\n{}",
                bosun_conformance::text(report)
            )
        })
}

#[test]
fn hello_passes_the_kit_with_the_grants_its_example_ships() {
    let dir = tempfile::tempdir().unwrap();
    let debian = dir.path().join("debian");
    let rocky = dir.path().join("rocky");
    os_root(&debian, "Debian GNU/Linux 13 (trixie)", "debian", true);
    os_root(&rocky, "Rocky Linux 9.6", "rocky", false);
    let grants = grants_of(&workspace_root().join("deploy/examples/plugin-hello.yaml"));
    let mut kit = kit(&plugins().hello, "hello", grants, dir.path());
    kit.roots = vec![
        Root {
            name: "debian".into(),
            template: debian,
            unsupported: false,
        },
        Root {
            name: "rocky".into(),
            template: rocky,
            unsupported: false,
        },
    ];
    kit.cases = vec![Case {
        name: String::new(),
        action: "greet".into(),
        params: json!({"name": "kit"}),
        changes_every_run: false,
        roots: Vec::new(),
        outputs_schema: Some(json!({
            "type": "object",
            "required": ["os", "kernel"],
            "properties": {"os": {"type": "string", "minLength": 1}, "kernel": {"type": "string", "minLength": 1}},
            "additionalProperties": false
        })),
    }];
    let report = bosun_conformance::run(&kit).unwrap();
    let text = bosun_conformance::text(&report);
    assert!(report.passed(), "{text}");
    for root in ["debian", "rocky"] {
        for name in [
            "preflight",
            "dry-run-changes-nothing",
            "run",
            "outputs-match-schema",
            "idempotent",
            "headroom",
        ] {
            assert_eq!(
                check(&report, root, "greet", name).status,
                Status::Pass,
                "{root} {name}: {text}"
            );
        }
    }
    assert!(
        check(&report, "rocky", "greet", "run")
            .message
            .contains("Rocky Linux 9.6"),
        "{text}"
    );
    let grants: Vec<(&str, bool)> = report
        .grants
        .iter()
        .map(|g| (g.grant.as_str(), g.used))
        .collect();
    assert_eq!(
        grants,
        [
            ("filesystem /etc (ReadOnly)", true),
            ("exec /usr/bin/uname -r (dryRun)", true)
        ],
        "{text}"
    );
    // Three runs per root (dry, run, again), each measured.
    assert_eq!(report.runs.len(), 6);
    assert!(
        report
            .runs
            .iter()
            .all(|r| r.memory_bytes > 0 && r.seconds > 0.0)
    );
    let xml = bosun_conformance::junit_xml(&report);
    assert!(
        xml.contains("<testsuites name=\"bosun plugin test hello\" tests=\"14\" failures=\"0\">"),
        "{xml}"
    );
    let json: serde_json::Value = serde_json::from_str(&report.json()).unwrap();
    assert_eq!(json["plugin"], "hello");
    assert_eq!(json["checks"].as_array().unwrap().len(), 12);
}

#[test]
fn the_kit_catches_a_false_idempotence_claim_an_unused_grant_and_an_action_without_a_case() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("debian");
    os_root(&root, "Debian GNU/Linux 13 (trixie)", "debian", false);
    std::fs::create_dir_all(root.join("var/lib/bosun-e2e")).unwrap();
    std::fs::create_dir_all(root.join("opt/unused")).unwrap();
    let fs = |path: &str, access| FilesystemGrant {
        path: path.into(),
        access,
        optional: false,
    };
    let grants = Grants {
        filesystem: vec![
            fs("/etc", Access::ReadOnly),
            fs("/var/lib/bosun-e2e", Access::ReadWrite),
            fs("/opt/unused", Access::ReadOnly),
        ],
        ..Grants::default()
    };
    let mut kit = kit(&plugins().steps, "e2e-steps", grants, dir.path());
    kit.roots = vec![Root {
        name: "debian".into(),
        template: root,
        unsupported: false,
    }];
    kit.cases = vec![
        Case {
            name: String::new(),
            action: "append".into(),
            params: json!({"name": "log"}),
            outputs_schema: None,
            changes_every_run: false,
            roots: Vec::new(),
        },
        Case {
            name: String::new(),
            action: "sleep".into(),
            params: json!({"millis": 1}),
            outputs_schema: None,
            changes_every_run: false,
            roots: Vec::new(),
        },
        Case {
            name: "write-once".into(),
            action: "write".into(),
            params: json!({"name": "w", "content": "x"}),
            outputs_schema: Some(
                json!({"required": ["wrote"], "properties": {"wrote": {"const": "/var/lib/bosun-e2e/other"}}}),
            ),
            changes_every_run: false,
            roots: Vec::new(),
        },
    ];
    let report = bosun_conformance::run(&kit).unwrap();
    let text = bosun_conformance::text(&report);
    assert!(!report.passed(), "{text}");

    let append = check(&report, "debian", "append", "idempotent");
    assert_eq!(append.status, Status::Fail, "{text}");
    assert!(
        append.message.contains("declared idempotent, but the second run changed the root: changed /var/lib/bosun-e2e/log"),
        "{text}"
    );
    // The dry runs changed nothing (the host makes every grant read-only in one).
    assert_eq!(
        check(&report, "debian", "append", "dry-run-changes-nothing").status,
        Status::Pass,
        "{text}"
    );
    let outputs = check(&report, "debian", "write-once", "outputs-match-schema");
    assert_eq!(outputs.status, Status::Fail, "{text}");
    assert!(outputs.message.contains("/wrote"), "{text}");
    assert_eq!(
        check(&report, "debian", "write-once", "idempotent").status,
        Status::Skip,
        "{text}"
    );
    for missing in ["sleep-once", "require"] {
        let c = check(&report, "-", missing, "has-a-case");
        assert_eq!(c.status, Status::Fail, "{text}");
    }
    let unused: Vec<&str> = report
        .grants
        .iter()
        .filter(|g| !g.used)
        .map(|g| g.grant.as_str())
        .collect();
    // `/etc` is what the plugin requests (for `require`, which has no case here): no case
    // that ran read it, so it is reported as wider than needed too.
    assert_eq!(
        unused,
        [
            "filesystem /etc (ReadOnly)",
            "filesystem /opt/unused (ReadOnly)"
        ],
        "{text}"
    );
    assert!(
        text.contains("UNUSED  filesystem /opt/unused (ReadOnly): wider than needed"),
        "{text}"
    );
}

/// The first-party `packages` plugin, with the grants its example ships, on part of its
/// matrix: real apt and dpkg in a Debian root with a local repository, and a Flatcar root
/// it has no backend for. On Debian, install, hold and unhold pass every check (dry runs
/// change nothing, a second run changes nothing); Flatcar is refused in preflight with the
/// reason. The grants for dnf, yum and binary downloads are reported unused, as they are on
/// this matrix, and `rollback` has no case: the kit says so instead of passing.
#[test]
fn packages_on_apt_and_an_unsupported_family() {
    const PKG: &str = "bosun-test-kubeadm";
    let dir = tempfile::tempdir().unwrap();
    let debian = dir.path().join("debian");
    bosun_plugins_tests::debian_root(&debian);
    bosun_plugins_tests::build_deb(&debian, PKG, "1.34.1-1.1");
    bosun_plugins_tests::index_repo(&debian);
    // As on a node apt has been used on: package lists and caches built. On a node whose
    // caches were cleaned (`apt-get clean`) the dry run fails: see the kit's findings in
    // docs/plugins.md.
    let out = bosun_plugins_tests::in_root(&debian, &["/usr/bin/apt-get", "-q", "update"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let flatcar = dir.path().join("flatcar");
    write(
        &flatcar,
        "etc/os-release",
        "NAME=\"Flatcar Container Linux by Kinvolk\"\nID=flatcar\nPRETTY_NAME=\"Flatcar Container Linux by Kinvolk 4081.2.0\"\n",
    );
    std::fs::create_dir_all(flatcar.join("usr/bin")).unwrap();

    let grants = bosun_plugins_tests::packages_grants_with_local_repository();
    // hold and unhold start from a node with the package installed: a root made so by the
    // plugin itself, outside the kit.
    let installed = dir.path().join("debian-installed");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(&debian)
        .arg(&installed)
        .status()
        .unwrap();
    assert!(status.success());
    let node = bosun_plugins_tests::Node::new(&installed, &["worker"]);
    let loaded = node.load(&plugins().packages, "packages");
    let ran = node.run(
        &loaded,
        &grants,
        "install",
        &json!({"packages": [PKG], "version": "1.34.1-1.1", "hold": false}),
        false,
    );
    assert!(ran.outcome().changed);

    let mut kit = kit(&plugins().packages, "packages", grants, dir.path());
    // apt's logs and caches change on every run that asks it anything (`apt-get update`
    // rebuilds pkgcache.bin): they are not the node's state.
    kit.ignore = vec!["/var/log".into(), "/var/cache/apt".into()];
    kit.roots = vec![
        Root {
            name: "debian".into(),
            template: debian,
            unsupported: false,
        },
        Root {
            name: "debian-installed".into(),
            template: installed,
            unsupported: false,
        },
        Root {
            name: "flatcar".into(),
            template: flatcar,
            unsupported: true,
        },
    ];
    let case = |action: &str, params: serde_json::Value, root: &str| Case {
        name: String::new(),
        action: action.into(),
        params,
        outputs_schema: None,
        changes_every_run: false,
        roots: vec![root.into(), "flatcar".into()],
    };
    kit.cases = vec![
        case(
            "install",
            json!({"packages": [PKG], "version": "1.34.1-1.1"}),
            "debian",
        ),
        case("hold", json!({"packages": [PKG]}), "debian-installed"),
        case("unhold", json!({"packages": [PKG]}), "debian-installed"),
    ];
    let report = bosun_conformance::run(&kit).unwrap();
    let text = bosun_conformance::text(&report);
    for (action, root) in [
        ("install", "debian"),
        ("hold", "debian-installed"),
        ("unhold", "debian-installed"),
    ] {
        for name in [
            "preflight",
            "dry-run-changes-nothing",
            "run",
            "idempotent",
            "headroom",
        ] {
            assert_eq!(
                check(&report, root, action, name).status,
                Status::Pass,
                "{action} {name}: {text}"
            );
        }
        let refused = check(&report, "flatcar", action, "preflight-refuses");
        assert_eq!(refused.status, Status::Pass, "{text}");
        assert!(
            refused.message.contains("no package backend for Flatcar"),
            "{text}"
        );
    }
    assert!(
        check(&report, "debian", "install", "preflight")
            .message
            .contains("pass version-available: bosun-test-kubeadm 1.34.1-1.1 is available"),
        "{text}"
    );
    assert!(
        check(&report, "debian", "install", "run")
            .message
            .starts_with("changed"),
        "{text}"
    );
    assert_eq!(
        check(&report, "-", "rollback", "has-a-case").status,
        Status::Fail,
        "{text}"
    );
    let used: Vec<&str> = report
        .grants
        .iter()
        .filter(|g| g.used)
        .map(|g| g.grant.as_str())
        .collect();
    assert!(
        used.iter().any(|g| g.starts_with("exec /usr/bin/apt-get")),
        "{text}"
    );
    assert!(
        used.iter().any(|g| g.starts_with("exec /usr/bin/apt-mark")),
        "{text}"
    );
    assert!(
        report
            .grants
            .iter()
            .any(|g| !g.used && g.grant.starts_with("exec /usr/bin/dnf")),
        "{text}"
    );
    assert!(!report.passed());
    println!("{text}");
}

/// The first-party `kubelet` plugin passes the kit with the grants its example ships:
/// `status` and `restart`, each on a Debian root. A restart changes something on every run
/// by design (the case says so): the second run may report it, and must leave the root as
/// the first did. The service calls go to the kit's recording stand-in for systemd.
#[test]
fn kubelet_passes_the_kit() {
    let dir = tempfile::tempdir().unwrap();
    let debian = dir.path().join("debian");
    write(
        &debian,
        "etc/os-release",
        "ID=debian\nVERSION_ID=12\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n",
    );
    let grants = bosun_plugins_tests::example_grants("kubelet.yaml");
    let mut kit = kit(&plugins().kubelet, "kubelet", grants, dir.path());
    kit.roots = vec![Root {
        name: "debian".into(),
        template: debian,
        unsupported: false,
    }];
    let case = |action: &str, every: bool| Case {
        name: String::new(),
        action: action.into(),
        params: if action == "restart" {
            json!({"settleSeconds": 1})
        } else {
            json!({})
        },
        outputs_schema: Some(json!({
            "required": ["activeState", "subState"],
            "properties": {"activeState": {"enum": ["active", "inactive"]}}
        })),
        changes_every_run: every,
        roots: Vec::new(),
    };
    kit.cases = vec![case("status", false), case("restart", true)];
    let report = bosun_conformance::run(&kit).unwrap();
    let text = bosun_conformance::text(&report);
    assert!(report.passed(), "{text}");
    let again = check(&report, "debian", "restart", "idempotent");
    assert!(
        again
            .message
            .contains("it reports a change on every run, as the case declares"),
        "{text}"
    );
    assert_eq!(
        check(&report, "debian", "status", "outputs-match-schema").status,
        Status::Pass,
        "{text}"
    );

    // Without the case's word for it, a restart's second run is a change, and the kit says so.
    kit.cases = vec![case("status", false), case("restart", false)];
    let report = bosun_conformance::run(&kit).unwrap();
    let again = check(&report, "debian", "restart", "idempotent");
    assert_eq!(again.status, Status::Fail);
    assert!(
        again
            .message
            .contains("declared idempotent, but the second run reported a change"),
        "{}",
        again.message
    );
}
