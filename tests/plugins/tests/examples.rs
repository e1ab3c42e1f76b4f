//! The example Plugin resources in deploy/examples/plugins grant each first-party plugin
//! exactly what its `describe()` requests: every request is covered (the agent's own
//! subset check, from bosun-policy, finds nothing missing) and every grant entry answers a
//! request (nothing granted beyond it).

use bosun_api::grants::{Access, Grants};
use bosun_plugins_tests::{Node, example_grants, plugins};
use bosun_policy::capabilities::uncovered;

fn assert_exact(name: &str, bytes: &[u8], grants: &Grants) {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::new(dir.path(), &[]);
    let plugin = node.load(bytes, name);
    let m = plugin.metadata();
    assert_eq!(m.name, name);
    // The agent's own conversion of what the plugin requested.
    let req = bosun_agent::gate::requested_of(&m.capabilities);
    let missing = uncovered(&req, grants);
    assert!(
        missing.is_empty(),
        "{name}: the example does not grant: {missing:#?}"
    );
    for g in &grants.filesystem {
        assert!(
            m.capabilities
                .filesystem
                .iter()
                .any(|(p, w)| p == &g.path && *w == (g.access == Access::ReadWrite)),
            "{name}: filesystem grant {g:?} answers no request"
        );
    }
    for g in &grants.exec {
        for args in &g.args {
            assert!(
                m.capabilities
                    .exec
                    .iter()
                    .any(|(c, a)| c == &g.command && a == args),
                "{name}: exec grant {} {args:?} answers no request",
                g.command
            );
        }
    }
    for g in &grants.services {
        let (_, actions) = m
            .capabilities
            .services
            .iter()
            .find(|(u, _)| u == &g.unit)
            .unwrap_or_else(|| panic!("{name}: unit {} not requested", g.unit));
        assert!(
            g.actions
                .iter()
                .all(|a| actions.iter().any(|r| r == a.as_str())),
            "{name}: {g:?}"
        );
    }
    for g in &grants.http {
        assert!(
            m.capabilities.http.contains(&g.host),
            "{name}: http grant {} not requested",
            g.host
        );
    }
}

#[test]
fn examples_grant_exactly_what_each_plugin_requests() {
    let p = plugins();
    assert_exact("certs", &p.certs, &example_grants("certs.yaml"));
    assert_exact(
        "kubeadm-upgrade",
        &p.kubeadm_upgrade,
        &example_grants("kubeadm-upgrade.yaml"),
    );
    assert_exact("packages", &p.packages, &example_grants("packages.yaml"));
    assert_exact("kubelet", &p.kubelet, &example_grants("kubelet.yaml"));
    assert_exact("etcd", &p.etcd, &example_grants("etcd.yaml"));
    assert_exact("reboot", &p.reboot, &example_grants("reboot.yaml"));
    // The community plugin's own manifest, the same way.
    assert_exact(
        "zypper",
        &p.zypper,
        &bosun_plugins_tests::grants_of(
            &bosun_plugins_tests::workspace_root().join("plugins/community/zypper/zypper.yaml"),
        ),
    );
}
