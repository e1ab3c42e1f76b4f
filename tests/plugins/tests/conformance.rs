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

/// A kit for `bytes`, signed as `name` by a fresh key its host trusts, for a worker.
fn kit(bytes: &[u8], name: &str, grants: Grants, work: &Path) -> Kit {
    kit_for(bytes, name, grants, &["worker"], work)
}

/// As [`kit`], for a node with `roles`.
pub(crate) fn kit_for(
    bytes: &[u8],
    name: &str,
    grants: Grants,
    roles: &[&str],
    work: &Path,
) -> Kit {
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
            roles: roles.iter().map(|r| (*r).to_owned()).collect(),
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

pub(crate) fn check<'r>(
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

/// Every check the kit makes of a case on a supported root, in the report's order.
pub(crate) const EVERY_CHECK: [&str; 6] = [
    "preflight",
    "dry-run-changes-nothing",
    "run",
    "outputs-match-schema",
    "idempotent",
    "headroom",
];

/// [`EVERY_CHECK`] but `outputs-match-schema`, which the kit skips for a case that declares
/// no outputs schema.
pub(crate) const EVERY_CHECK_BUT_OUTPUTS: [&str; 5] = [
    "preflight",
    "dry-run-changes-nothing",
    "run",
    "idempotent",
    "headroom",
];

/// Asserts that each check in `names` of `case` on `root` passed, printing the report if not.
pub(crate) fn assert_passed(report: &Report, root: &str, case: &str, names: &[&str]) {
    for name in names {
        assert_eq!(
            check(report, root, case, name).status,
            Status::Pass,
            "{case} on {root}: {name}: {}",
            bosun_conformance::text(report)
        );
    }
}

/// The checks that failed, as `root/case/check`, and the unused grants.
pub(crate) fn failures(report: &Report) -> (Vec<String>, Vec<&str>) {
    let checks = report
        .checks
        .iter()
        .filter(|c| c.status == Status::Fail)
        .map(|c| format!("{}/{}/{}", c.root, c.case, c.check))
        .collect();
    let grants = report
        .grants
        .iter()
        .filter(|g| !g.used)
        .map(|g| g.grant.as_str())
        .collect();
    (checks, grants)
}

/// A root of the matrix, made from `template`.
pub(crate) fn root(name: &str, template: &Path, unsupported: bool) -> Root {
    Root {
        name: name.into(),
        template: template.to_owned(),
        unsupported,
    }
}

/// A case of `action` on `roots` (every root when empty), named after the action, without an
/// outputs schema.
pub(crate) fn case(action: &str, params: serde_json::Value, roots: &[&str]) -> Case {
    Case {
        name: String::new(),
        action: action.into(),
        params,
        outputs_schema: None,
        changes_every_run: false,
        roots: roots.iter().map(|r| (*r).to_owned()).collect(),
    }
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
        assert_passed(&report, root, "greet", &EVERY_CHECK);
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

/// The first-party `packages` plugin, with the grants its example ships, over the matrix
/// this machine can build: real apt and dpkg in a Debian root and real dnf 4 and rpm in a
/// Rocky root, each with a local repository of four packages; copies of each with the four
/// installed and held, for `hold`, `unhold` and (dnf) installs that downgrade; the binary
/// backend on a Flatcar root downloading from `dl.k8s.io` through the shipped grant (a TLS
/// server on loopback with a certificate for dl.k8s.io from a CA the kit's host is given,
/// as a kit file's `http` section does), and `rollback` on a Flatcar root whose binary the
/// backend replaced before; a Flatcar root the apt and dnf cases are refused on in
/// preflight, and an Amazon Linux 2 root (yum 3) the dnf case is refused on, saying why
/// and what to use. Installs of one to four packages use each argument pattern the grants
/// give.
///
/// The kit passes: every check, and every grant used. dnf's dry runs pass because their
/// grant keeps `/var/log` writable in a dry run (`writableInDryRun`): dnf opens
/// `/var/log/dnf.log` for writing even to list, and before that every dnf install's dry run
/// failed here (the kit's finding, and a defect on real RHEL nodes).
#[test]
fn packages_over_apt_dnf_binary_and_rollback() {
    use crate::packages::{Reply, serve, serve_tls, sha256};
    use bosun_plugins_tests::{build_deb, build_rpm, in_root, index_repo, index_rpm_repo};
    const PKGS: [&str; 4] = [
        "bosun-test-kubeadm",
        "bosun-test-kubelet",
        "bosun-test-kubectl",
        "bosun-test-cri-tools",
    ];
    assert!(
        bosun_plugins_tests::have_rpm_tools(),
        "dnf, dnf-plugins-core, rpm and createrepo-c are needed: apt-get install dnf dnf-plugins-core rpm createrepo-c"
    );
    let dir = tempfile::tempdir().unwrap();
    let copy = |from: &Path, to: &str| {
        let to = dir.path().join(to);
        let status = std::process::Command::new("cp")
            .arg("-a")
            .arg(from)
            .arg(&to)
            .status()
            .unwrap();
        assert!(status.success());
        to
    };

    let debian = dir.path().join("debian");
    bosun_plugins_tests::debian_root(&debian);
    for p in PKGS {
        build_deb(&debian, p, "1.34.1-1.1");
    }
    index_repo(&debian);
    // As on a node apt has been used on: package lists and caches built. On a node whose
    // caches were cleaned (`apt-get clean`) the dry run fails: see the kit's findings in
    // docs/plugins.md.
    let out = in_root(&debian, &["/usr/bin/apt-get", "-q", "update"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rocky = dir.path().join("rocky");
    bosun_plugins_tests::rhel_root(&rocky);
    for p in PKGS {
        for v in ["1.34.1", "1.34.2"] {
            build_rpm(&rocky, p, v, "150500.1.1");
        }
    }
    index_rpm_repo(&rocky);

    let amazon2 = dir.path().join("amazon-linux-2");
    write(
        &amazon2,
        "etc/os-release",
        "NAME=\"Amazon Linux\"\nVERSION=\"2\"\nID=\"amzn\"\nID_LIKE=\"centos rhel fedora\"\nVERSION_ID=\"2\"\nPRETTY_NAME=\"Amazon Linux 2\"\n",
    );
    std::fs::create_dir_all(amazon2.join("usr/bin")).unwrap();
    let flatcar = dir.path().join("flatcar");
    write(
        &flatcar,
        "etc/os-release",
        "NAME=\"Flatcar Container Linux by Kinvolk\"\nID=flatcar\nPRETTY_NAME=\"Flatcar Container Linux by Kinvolk 4081.2.0\"\n",
    );
    install_programs(&flatcar, &["/usr/bin/chmod"]);
    write(&flatcar, "usr/bin/kubeadm", "#!/bin/sh\necho old\n");
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(
        flatcar.join("usr/bin/kubeadm"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let new: Vec<u8> = (0..50_000u32).flat_map(|i| i.to_le_bytes()).collect();
    let (addr, _hits) = serve(vec![
        ("/v1.34.2/kubeadm", Reply::Full(new.clone())),
        (
            "/v1.34.2/kubeadm.sha256",
            Reply::Full(format!("{}  kubeadm\n", sha256(&new)).into_bytes()),
        ),
    ]);
    let binary = json!({"backend": "binary", "binaries": [{"name": "kubeadm", "url": format!("http://{addr}/v1.34.2/kubeadm")}]});
    // dl.k8s.io as the shipped grant names it: served over TLS from loopback, with a
    // certificate for dl.k8s.io from a CA the kit's host is given (the kit file's `http`).
    let (kubeadm, digest) = match std::env::consts::ARCH {
        "aarch64" => (
            "/release/v1.34.2/bin/linux/arm64/kubeadm",
            "/release/v1.34.2/bin/linux/arm64/kubeadm.sha256",
        ),
        _ => (
            "/release/v1.34.2/bin/linux/amd64/kubeadm",
            "/release/v1.34.2/bin/linux/amd64/kubeadm.sha256",
        ),
    };
    let (dl, _dl_hits, dl_ca) = serve_tls(
        vec![
            (kubeadm, Reply::Full(new.clone())),
            (
                digest,
                Reply::Full(format!("{}\n", sha256(&new)).into_bytes()),
            ),
        ],
        &["dl.k8s.io"],
    );
    let from_dl_k8s_io =
        json!({"backend": "binary", "packages": ["kubeadm"], "kubernetesVersion": "v1.34.2"});

    // The shipped grants, with the local repositories' directory: what the kit checks.
    let grants = bosun_plugins_tests::packages_grants_with_local_repository();
    // The same with the plain loopback server added, as an administrator adds a mirror:
    // only to make the `flatcar-replaced` root below, outside the kit.
    let mut with_mirror = grants.clone();
    with_mirror.http.push(bosun_api::grants::HttpGrant {
        host: addr.clone(),
        max_bytes: Some(16 << 20),
    });

    // The roots `hold`, `unhold`, the downgrades and `rollback` start from, made by the
    // plugin itself outside the kit.
    let installed = |from: &Path, name: &str, params: serde_json::Value| {
        let root = copy(from, name);
        let node = bosun_plugins_tests::Node::new(&root, &["worker"]);
        let loaded = node.load(&plugins().packages, "packages");
        let ran = node.run(&loaded, &with_mirror, "install", &params, false);
        assert!(ran.outcome().changed, "{name}: {}", ran.outcome().message);
        root
    };
    let at = |n: usize, version: &str| json!({"packages": PKGS[..n], "version": version});
    let debian_installed = installed(&debian, "debian-installed", at(4, "1.34.1-1.1"));
    let rocky_installed = installed(&rocky, "rocky-installed", at(4, "1.34.2-150500.1.1"));
    let flatcar_replaced = installed(&flatcar, "flatcar-replaced", binary);
    let flatcar_binary = copy(&flatcar, "flatcar-binary");

    let mut kit = kit(&plugins().packages, "packages", grants, dir.path());
    kit.host
        .http
        .resolve
        .push(("dl.k8s.io:443".into(), dl.parse().unwrap()));
    kit.host
        .http
        .add_ca_pem(dl_ca.as_bytes(), "the kit's CA")
        .unwrap();
    // What apt and dnf rewrite on every run that asks them anything (logs, apt's binary
    // caches rebuilt by `apt-get update`, dnf's metadata cache and history): not the node's
    // packages, which the snapshots keep (/var/lib/dpkg, /var/lib/rpm, the locks).
    kit.ignore = vec![
        "/var/log".into(),
        "/var/cache/apt".into(),
        "/var/cache/dnf".into(),
        "/var/lib/dnf".into(),
    ];
    kit.roots = vec![
        root("debian", &debian, false),
        root("debian-installed", &debian_installed, false),
        root("rocky", &rocky, false),
        root("rocky-installed", &rocky_installed, false),
        root("flatcar-binary", &flatcar_binary, false),
        root("flatcar-replaced", &flatcar_replaced, false),
        root("flatcar", &flatcar, true),
        root("amazon-linux-2", &amazon2, true),
    ];
    let case = |name: String, action: &str, params: serde_json::Value, roots: &[&str]| Case {
        name,
        ..case(action, params, roots)
    };
    let names = json!({"packages": PKGS});
    let mut cases = Vec::new();
    for n in 1..=4 {
        cases.push(case(
            format!("install-apt-{n}"),
            "install",
            at(n, "1.34.1-1.1"),
            if n == 1 {
                &["debian", "flatcar"]
            } else {
                &["debian"]
            },
        ));
        cases.push(case(
            format!("install-dnf-{n}"),
            "install",
            at(n, "1.34.1-150500.1.1"),
            if n == 1 {
                &["rocky", "amazon-linux-2"]
            } else {
                &["rocky"]
            },
        ));
        cases.push(case(
            format!("downgrade-dnf-{n}"),
            "install",
            at(n, "1.34.1-150500.1.1"),
            &["rocky-installed"],
        ));
    }
    cases.extend([
        case(
            "install-binary".into(),
            "install",
            from_dl_k8s_io,
            &["flatcar-binary"],
        ),
        case(
            "hold".into(),
            "hold",
            names.clone(),
            &["debian-installed", "rocky-installed", "flatcar"],
        ),
        case(
            "unhold".into(),
            "unhold",
            names,
            &["debian-installed", "rocky-installed"],
        ),
        case(
            String::new(),
            "rollback",
            json!({"paths": ["/usr/bin/kubeadm"]}),
            &["flatcar-replaced"],
        ),
    ]);
    kit.cases = cases;
    let report = bosun_conformance::run(&kit).unwrap();
    let text = bosun_conformance::text(&report);
    println!("{text}");

    // Every check passes.
    let (failed, unused) = failures(&report);
    assert!(failed.is_empty(), "{failed:#?}\n{text}");
    for n in 1..=4 {
        for (case, root) in [
            (format!("install-apt-{n}"), "debian"),
            (format!("install-dnf-{n}"), "rocky"),
            (format!("downgrade-dnf-{n}"), "rocky-installed"),
        ] {
            assert_passed(&report, root, &case, &EVERY_CHECK_BUT_OUTPUTS);
        }
    }
    assert!(
        check(&report, "rocky-installed", "downgrade-dnf-1", "run")
            .message
            .contains("1.34.1-150500.1.1"),
        "{text}"
    );
    for (case, root) in [
        ("install-binary", "flatcar-binary"),
        ("hold", "debian-installed"),
        ("hold", "rocky-installed"),
        ("unhold", "debian-installed"),
        ("unhold", "rocky-installed"),
    ] {
        assert_passed(&report, root, case, &EVERY_CHECK_BUT_OUTPUTS);
    }
    assert_passed(&report, "flatcar-replaced", "rollback", &["run"]);
    for case in ["install-apt-1", "hold"] {
        let refused = check(&report, "flatcar", case, "preflight-refuses");
        assert!(
            refused.message.contains("no package backend for Flatcar"),
            "{case}: {text}"
        );
    }
    let refused = check(
        &report,
        "amazon-linux-2",
        "install-dnf-1",
        "preflight-refuses",
    );
    assert!(
        refused
            .message
            .contains("no package backend for Amazon Linux 2 (ID=amzn, VERSION_ID=2): yum 3"),
        "{text}"
    );
    assert!(unused.is_empty(), "{unused:#?}\n{text}");
    assert!(report.passed(), "{text}");
    assert!(
        text.contains("used    http dl.k8s.io"),
        "the binary case did not download from dl.k8s.io:\n{text}"
    );
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
