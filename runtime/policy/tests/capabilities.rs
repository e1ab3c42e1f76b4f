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
    });
    let d = ev.capabilities(&plugin(), &within, &shell, None);
    assert_eq!(
        d.deny_messages(),
        vec!["no-shells: certs may not run a shell"]
    );
}
