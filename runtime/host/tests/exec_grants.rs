//! Exec and service grants, end to end through real plugins (plugins/testing) in a real
//! host: how argument patterns match, where granted commands start, and which unit
//! names a service grant or request may use. Each test names the hole it closes.

use crate::support;

use bosun_api::grants::{Grants, ServiceAction, ServiceGrant};
use bosun_host::{CallFailure, Error, Host, LoadedPlugin, NodeContext, PluginError, RunReport};
use support::{exec_grant, node, plugins, require_root, run_on};

fn ctx() -> NodeContext {
    NodeContext {
        node_name: "cp-1".into(),
        roles: vec!["control-plane".into()],
        kubelet_version: None,
    }
}

fn run(
    host: &Host,
    p: &LoadedPlugin,
    grants: &Grants,
    action: &str,
    params: &str,
) -> Result<RunReport, CallFailure> {
    run_on(host, p, grants, &ctx(), action, params)
}

/// Runs the `bad` plugin's `exec` action with `args` and returns its result.
fn exec(
    host: &Host,
    bad: &LoadedPlugin,
    grants: &Grants,
    command: &str,
    args: &[&str],
) -> Result<String, PluginError> {
    let params = serde_json::json!({ "command": command, "args": args }).to_string();
    let report = run(host, bad, grants, "exec", &params)
        .unwrap_or_else(|f| panic!("{command} {args:?}: host failure {f}"));
    report.result.map(|o| o.message)
}

fn refused(
    host: &Host,
    bad: &LoadedPlugin,
    grants: &Grants,
    command: &str,
    args: &[&str],
) -> String {
    match exec(host, bad, grants, command, args) {
        Err(e) => {
            assert_eq!(
                e.code, "host:not-granted",
                "{command} {args:?}: {}",
                e.message
            );
            e.message
        }
        Ok(m) => panic!("{command} {args:?} was NOT refused: {m}"),
    }
}

#[test]
fn path_patterns_do_not_admit_dotdot_or_deeper_paths() {
    // The granted run below is checked to be confined ("from inside-the-root").
    require_root("path_patterns_do_not_admit_dotdot_or_deeper_paths");
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    // greet stands in for `rm -f /etc/kubernetes/tmp/*`.
    let grants = Grants {
        exec: vec![exec_grant("/usr/bin/greet", &[&["/etc/kubernetes/tmp/*"]])],
        ..Grants::default()
    };
    let m = refused(
        &host,
        &bad,
        &grants,
        "/usr/bin/greet",
        &["/etc/kubernetes/tmp/../../shadow"],
    );
    assert!(m.contains("`..` component"), "{m}");
    refused(
        &host,
        &bad,
        &grants,
        "/usr/bin/greet",
        &["/etc/kubernetes/tmp/sub/file"],
    );
    refused(
        &host,
        &bad,
        &grants,
        "/usr/bin/greet",
        &["/etc/kubernetes/tmp/.hidden"],
    );
    // What the pattern means does run.
    let ok = exec(
        &host,
        &bad,
        &grants,
        "/usr/bin/greet",
        &["/etc/kubernetes/tmp/old.conf"],
    )
    .unwrap();
    assert!(
        ok.contains("hello /etc/kubernetes/tmp/old.conf from inside-the-root"),
        "{ok}"
    );
}

#[test]
fn a_wildcard_operand_does_not_admit_options() {
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    // greet stands in for `kubeadm certs renew *`; options must be granted by name.
    let grants = Grants {
        exec: vec![exec_grant(
            "/usr/bin/greet",
            &[&["*"], &["--config=/etc/kubeadm/*.yaml"]],
        )],
        ..Grants::default()
    };
    let m = refused(&host, &bad, &grants, "/usr/bin/greet", &["--config=/x"]);
    assert!(
        m.contains("matches only a pattern that itself starts with `-`"),
        "{m}"
    );
    refused(&host, &bad, &grants, "/usr/bin/greet", &["-h"]);
    refused(
        &host,
        &bad,
        &grants,
        "/usr/bin/greet",
        &["--config=/etc/kubeadm/../../x.yaml"],
    );
    let ok = exec(
        &host,
        &bad,
        &grants,
        "/usr/bin/greet",
        &["--config=/etc/kubeadm/a.yaml"],
    )
    .unwrap();
    assert!(ok.contains("hello --config=/etc/kubeadm/a.yaml"), "{ok}");
    let ok = exec(&host, &bad, &grants, "/usr/bin/greet", &["all"]).unwrap();
    assert!(ok.contains("hello all"), "{ok}");
}

/// The package argument of an install grant (`[a-z0-9]*=[0-9]*`, as the shipped zypper and
/// apt grants have it) admits `name=version` and nothing a package manager would fetch or
/// read from elsewhere: no URL (zypper installs `http://host/x.rpm?v=1` from the network),
/// no path, no hidden file, no option, no climb. `greet` stands in for zypper.
#[test]
fn a_package_pattern_admits_name_version_not_urls_paths_or_options() {
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    let grants = Grants {
        exec: vec![exec_grant(
            "/usr/bin/greet",
            &[&["install", "--oldpackage", "[a-z0-9]*=[0-9]*"]],
        )],
        ..Grants::default()
    };
    fn install(arg: &str) -> [&str; 3] {
        ["install", "--oldpackage", arg]
    }
    for hostile in [
        "http://evil.example/kubeadm.rpm?v=1",
        "ftp:/evil.example/k=1",
        "/tmp/kubeadm=1.rpm",
        "k/../../tmp/x=1.rpm",
        ".hidden=1",
        "-repo=1",
        "kubeadm=v1.34.4",
        "Kubeadm=1.34.4",
    ] {
        refused(&host, &bad, &grants, "/usr/bin/greet", &install(hostile));
    }
    let ok = exec(
        &host,
        &bad,
        &grants,
        "/usr/bin/greet",
        &install("kubeadm=1.34.4-150500.1.1"),
    )
    .unwrap();
    // greet says hello to its first argument: it ran.
    assert!(ok.contains("exit 0: hello install"), "{ok}");
}

/// A host whose host root is the real `/` (the node fixture kept alive beside it), and the
/// `bad` test plugin loaded into it.
fn real_root_host() -> (support::Node, Host, LoadedPlugin) {
    let node = node();
    let mut config = node.config();
    config.host_root = "/".into();
    let host = Host::new(config).unwrap();
    let bad = node.load(&host, &plugins().bad, "bad");
    (node, host, bad)
}

#[test]
fn commands_on_the_real_root_start_in_slash_not_in_the_agents_directory() {
    let (_node, host, bad) = real_root_host();
    let grants = Grants {
        exec: vec![exec_grant("/usr/bin/pwd", &[])],
        ..Grants::default()
    };
    assert_ne!(
        std::env::current_dir().unwrap(),
        std::path::Path::new("/"),
        "the test must not itself run in /"
    );
    let out = exec(&host, &bad, &grants, "/usr/bin/pwd", &[]).unwrap();
    assert!(out.ends_with("exit 0: /\n"), "{out:?}");
}

/// A step's `hostMilliseconds` (the node's share of its time) comes from here: the time
/// inside granted commands is counted, and a refused command counts nothing.
#[test]
fn time_inside_granted_commands_is_reported_and_refused_calls_count_none() {
    let (_node, host, bad) = real_root_host();
    let grants = Grants {
        exec: vec![exec_grant("/usr/bin/sleep", &[&["0.3"]])],
        ..Grants::default()
    };
    let call = |args: &[&str]| {
        let params = serde_json::json!({ "command": "/usr/bin/sleep", "args": args }).to_string();
        run(&host, &bad, &grants, "exec", &params).unwrap()
    };
    let slept = call(&["0.3"]);
    assert!(slept.result.is_ok(), "{:?}", slept.result);
    assert!(
        slept.captured.host_time >= std::time::Duration::from_millis(300),
        "a 0.3 s sleep counted {:?} of host time",
        slept.captured.host_time
    );
    let refused = call(&["5"]);
    assert_eq!(
        refused
            .result
            .as_ref()
            .map_err(|e| e.code.as_str())
            .unwrap_err(),
        "host:not-granted"
    );
    assert_eq!(refused.captured.host_time, std::time::Duration::ZERO);
}

#[test]
fn unit_names_with_glob_characters_are_refused_in_requests_and_grants() {
    let node = node();
    let host = node.host();
    let good = node.load(&host, &plugins().good, "good");
    let grants = Grants {
        services: vec![ServiceGrant {
            unit: "kubelet.service".into(),
            actions: vec![ServiceAction::Restart],
        }],
        ..Grants::default()
    };
    for unit in [
        "kube*.service",
        "kubelet.servic?",
        "kube[l]et.service",
        "kubelet\\x2eservice",
    ] {
        let params = serde_json::json!({ "unit": unit, "action": "restart" }).to_string();
        let e = run(&host, &good, &grants, "service", &params)
            .unwrap()
            .result
            .unwrap_err();
        assert_eq!(e.code, "invalid-argument", "{unit}: {}", e.message);
        assert!(
            e.message.contains("pattern matching many units"),
            "{unit}: {}",
            e.message
        );
    }
    // A grant naming a pattern is itself refused, before the plugin runs.
    let globbed = Grants {
        services: vec![ServiceGrant {
            unit: "kube*".into(),
            actions: vec![ServiceAction::Stop],
        }],
        ..Grants::default()
    };
    let f = match run(
        &host,
        &good,
        &globbed,
        "service",
        r#"{"unit":"kube*","action":"stop"}"#,
    ) {
        Err(f) => f,
        Ok(r) => panic!("a glob service grant was accepted: {:?}", r.result),
    };
    match &f.error {
        Error::InvalidGrant { grant, reason } => {
            assert_eq!(grant, "service kube*");
            assert!(reason.contains("pattern matching many units"), "{reason}");
        }
        other => panic!("expected an invalid grant, got {other}"),
    }
    assert!(
        node.services.calls().is_empty(),
        "the backend was reached: {:?}",
        node.services.calls()
    );
    // The exact unit still works.
    run(
        &host,
        &good,
        &grants,
        "service",
        r#"{"unit":"kubelet.service","action":"restart"}"#,
    )
    .unwrap()
    .result
    .unwrap();
    assert_eq!(node.services.calls(), ["restart kubelet.service"]);
}
