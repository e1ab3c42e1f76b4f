//! The capabilities decision point.

use bosun_api::grants as api;
use bosun_policy::capabilities::{CommandRequest, Grants, PathRequest, RequestedCapabilities};
use bosun_policy::input::PluginInfo;
use bosun_policy::{DecisionPoint, Enforcement, Limits, PolicySet, PolicySource};

fn api_grants() -> api::Grants {
    api::Grants {
        filesystem: vec![api::FilesystemGrant {
            path: "/etc/kubernetes/pki".into(),
            access: api::Access::ReadWrite,
            optional: false,
        }],
        exec: vec![api::ExecGrant {
            command: "/usr/bin/kubeadm".into(),
            args: vec![vec!["certs".into(), "renew".into(), "*".into()]],
            timeout_seconds: Some(60),
            max_output_bytes: None,
            dry_run: false,
            optional: false,
            sandbox: Default::default(),
        }],
        services: vec![api::ServiceGrant {
            unit: "kubelet.service".into(),
            actions: vec![api::ServiceAction::Restart],
        }],
        http: vec![api::HttpGrant {
            host: "dl.k8s.io".into(),
            max_bytes: Some(1 << 20),
        }],
    }
}

fn plugin() -> PluginInfo {
    PluginInfo {
        name: "certs".into(),
        version: "0.1.0".into(),
        digest: format!("sha256:{}", "ab".repeat(32)),
        signer: Some("bosun-release-2026".into()),
    }
}

const NO_SHELLS: &str = r#"package bosun.capabilities.no_shells
deny contains msg if {
    some g in input.grants.exec
    endswith(g.command, "/sh")
    msg := sprintf("%s may not run a shell", [input.plugin.name])
}
"#;

#[test]
fn requests_must_be_granted_before_policies_run() {
    let set = PolicySet::compile(
        &[PolicySource {
            name: "no-shells".into(),
            rego: NO_SHELLS.into(),
            data: None,
            enforcement: Enforcement::Deny,
        }],
        Limits::default(),
    );
    let mut ev = set.evaluator();
    let grants: Grants = api_grants();
    let within = RequestedCapabilities {
        filesystem: vec![PathRequest {
            path: "/etc/kubernetes/pki/etcd".into(),
            writable: true,
        }],
        exec: vec![CommandRequest {
            command: "/usr/bin/kubeadm".into(),
            args: vec!["certs".into(), "renew".into(), "all".into()],
        }],
        ..RequestedCapabilities::default()
    };
    let d = ev.capabilities(&plugin(), &within, &grants, Some("cp-1"));
    assert!(d.allowed, "{:?}", d.denies);
    assert_eq!(d.point, DecisionPoint::Capabilities);

    let beyond = RequestedCapabilities {
        filesystem: vec![PathRequest {
            path: "/etc/kubernetes/manifests".into(),
            writable: true,
        }],
        ..within.clone()
    };
    let d = ev.capabilities(&plugin(), &beyond, &grants, None);
    assert!(!d.allowed);
    assert_eq!(d.denies.len(), 1);
    assert_eq!(d.denies[0].policy, "bosun");
    assert!(d.denies[0].message.contains("/etc/kubernetes/manifests"));

    // Covered requests, but a grant the policy forbids.
    let mut shell = grants.clone();
    shell.exec.push(bosun_policy::capabilities::ExecGrant {
        command: "/bin/sh".into(),
        args: vec![vec!["-c".into(), "**".into()]],
        timeout_seconds: None,
        max_output_bytes: None,
        dry_run: false,
        optional: false,
        sandbox: Default::default(),
    });
    let d = ev.capabilities(&plugin(), &within, &shell, None);
    assert_eq!(
        d.deny_messages(),
        vec!["no-shells: certs may not run a shell"]
    );
}

/// The shipped certs example's grants: root on the node by nature (it writes static Pod
/// manifests).
fn certs_grants() -> Grants {
    serde_json::from_value(serde_json::json!({
        "filesystem": [
            {"path": "/etc/kubernetes", "access": "ReadOnly"},
            {"path": "/etc/kubernetes/manifests", "access": "ReadWrite"}
        ],
        "exec": [{
            "command": "/usr/bin/kubeadm",
            "args": [["certs", "renew", "*"]],
            "sandbox": {
                "filesystem": [
                    {"path": "/etc/kubernetes", "access": "ReadWrite"},
                    {"path": "/var/lib/kubelet", "access": "ReadOnly"}
                ],
                "tcpConnect": [6443]
            }
        }]
    }))
    .unwrap()
}

/// Without the shipped policy root-equivalent grants are warnings from `bosun`; with it
/// they are denies until the administrator names the plugin in its data.
#[test]
fn root_equivalent_grants_warn_and_the_shipped_policy_denies_them_until_allowed_by_name() {
    let grants = certs_grants();
    let requested = RequestedCapabilities {
        filesystem: vec![PathRequest {
            path: "/etc/kubernetes/manifests".into(),
            writable: true,
        }],
        exec: vec![CommandRequest {
            command: "/usr/bin/kubeadm".into(),
            args: vec!["certs".into(), "renew".into(), "all".into()],
        }],
        ..RequestedCapabilities::default()
    };
    let findings = bosun_policy::capabilities::root_equivalent("certs", &grants);
    assert_eq!(findings.len(), 4, "{findings:?}");
    assert!(
        findings
            .iter()
            .all(|f| f.ends_with("name it in root_equivalent_grants.allowed_plugins")),
        "{findings:?}"
    );

    let warned = |d: &bosun_policy::Decision| -> Vec<String> {
        d.warnings
            .iter()
            .filter(|f| f.policy == "bosun")
            .map(|f| f.message.clone())
            .collect()
    };
    // No policy: allowed, with every finding as a warning.
    let none = PolicySet::compile(&[], Limits::default());
    let d = none
        .evaluator()
        .capabilities(&plugin(), &requested, &grants, None);
    assert!(d.allowed, "{:?}", d.denies);
    assert_eq!(warned(&d), findings);

    // The shipped policy with its shipped data: denied, the same messages.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../policies/root-equivalent-grants");
    let shipped = bosun_policy::load_policies(&dir).unwrap();
    assert_eq!(shipped.len(), 1);
    let set = PolicySet::compile(&shipped, Limits::default());
    assert!(set.is_healthy(), "{:?}", set.statuses());
    let d = set
        .evaluator()
        .capabilities(&plugin(), &requested, &grants, None);
    assert!(!d.allowed);
    let mut denied: Vec<String> = d
        .denies
        .iter()
        .map(|f| {
            assert_eq!(f.policy, "root-equivalent-grants");
            f.message.clone()
        })
        .collect();
    denied.sort();
    assert_eq!(denied, findings);

    // Allowed by name: the plugin runs (the warnings stay, for the record).
    let allowed = PolicySource {
        data: Some(serde_json::json!({
            "root_equivalent_grants": {"allowed_plugins": ["kubeadm-upgrade", "certs"]}
        })),
        ..shipped[0].clone()
    };
    let set = PolicySet::compile(&[allowed], Limits::default());
    let d = set
        .evaluator()
        .capabilities(&plugin(), &requested, &grants, None);
    assert!(d.allowed, "{:?}", d.denies);
    assert_eq!(warned(&d), findings);
}
