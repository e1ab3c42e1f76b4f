//! DryRun is enforced by the host, not trusted to the plugin: the `bad` test plugin
//! ignores the dry-run flag and tries to change the node anyway. In a dry run every
//! filesystem grant is read-only, only exec grants marked `dryRun: true` run, and no
//! service action but `status` reaches the backend. The same grants in a normal run do
//! all of it (so each refusal is the dry run's, not a missing grant's).

use crate::support;

use std::time::Duration;

use bosun_api::grants::{Access, Grants, ServiceAction, ServiceGrant};
use bosun_host::{Host, LoadedPlugin, NodeContext, PluginError, RunOptions, RunReport};
use support::{exec_grant, fs, node, plugins};

fn ctx() -> NodeContext {
    NodeContext {
        node_name: "cp-1".into(),
        roles: vec!["control-plane".into()],
        kubelet_version: None,
    }
}

fn call(
    host: &Host,
    p: &LoadedPlugin,
    grants: &Grants,
    action: &str,
    params: &str,
    dry_run: bool,
) -> RunReport {
    host.run(
        p,
        grants,
        &ctx(),
        action,
        params,
        RunOptions {
            dry_run,
            resumed: false,
            deadline: Some(Duration::from_secs(60)),
        },
    )
    .unwrap_or_else(|f| panic!("{action} {params}: host failure {f}"))
}

fn refused(
    host: &Host,
    p: &LoadedPlugin,
    grants: &Grants,
    action: &str,
    params: &str,
) -> (PluginError, RunReport) {
    let report = call(host, p, grants, action, params, true);
    match &report.result {
        Err(e) => (e.clone(), report),
        Ok(o) => panic!(
            "{action} {params} was NOT refused in a dry run: {}",
            o.message
        ),
    }
}

/// Every byte and name under `dir`, for before/after comparisons.
fn snapshot(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let path = e.path();
            let rel = path.strip_prefix(dir).unwrap().display().to_string();
            if e.file_type().unwrap().is_dir() {
                stack.push(path);
                out.push((rel, Vec::new()));
            } else if e.file_type().unwrap().is_file() {
                out.push((rel, std::fs::read(&path).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn a_dry_run_cannot_write_through_a_read_write_grant() {
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    let grants = Grants {
        filesystem: vec![fs("/rw", Access::ReadWrite)],
        ..Grants::default()
    };
    std::fs::write(node.root().join("rw/existing"), "original").unwrap();
    let before = snapshot(&node.root().join("rw"));
    for (action, params) in [
        ("write", r#"{"path":"/rw/existing"}"#),
        ("create", r#"{"path":"/rw/new"}"#),
        ("truncate", r#"{"path":"/rw/existing"}"#),
        ("rename", r#"{"from":"/rw/existing","to":"/rw/moved"}"#),
        ("hardlink", r#"{"from":"/rw/existing","to":"/rw/linked"}"#),
    ] {
        let (e, _) = refused(&host, &bad, &grants, action, params);
        // WASI's own refusal of a write through a read-only preopen: not-permitted or
        // read-only, never "not found" or an error that could come from anything else.
        assert!(
            ["io:PermissionDenied", "io:ReadOnlyFilesystem"].contains(&e.code.as_str()),
            "{action}: expected a permission refusal, got {} {}",
            e.code,
            e.message
        );
        assert_eq!(
            snapshot(&node.root().join("rw")),
            before,
            "{action} changed /rw in a dry run"
        );
    }
    // The same grant outside a dry run writes: the refusals above were the dry run's.
    let wet = call(
        &host,
        &bad,
        &grants,
        "write",
        r#"{"path":"/rw/existing"}"#,
        false,
    );
    assert!(wet.result.is_ok(), "{:?}", wet.result);
    assert_eq!(
        std::fs::read_to_string(node.root().join("rw/existing")).unwrap(),
        "pwned"
    );
}

#[test]
fn a_dry_run_runs_only_commands_granted_as_dry_run_safe() {
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    let params = |arg: &str| format!(r#"{{"command":"/usr/bin/greet","args":["{arg}"]}}"#);
    // One command granted twice: `plan` marked dry-run safe, `apply` not.
    let mut safe = exec_grant("/usr/bin/greet", &[&["plan"]]);
    safe.dry_run = true;
    let grants = Grants {
        exec: vec![exec_grant("/usr/bin/greet", &[&["apply"]]), safe],
        ..Grants::default()
    };

    let (e, report) = refused(&host, &bad, &grants, "exec", &params("apply"));
    assert_eq!(e.code, "host:not-granted", "{}", e.message);
    assert!(
        e.message.starts_with("dry run: /usr/bin/greet apply")
            && e.message.contains("dryRun: true"),
        "{}",
        e.message
    );
    assert_eq!(report.captured.denied.len(), 1);
    assert_eq!(report.captured.denied[0].capability, "exec");
    assert!(
        report.captured.denied[0].message.starts_with("dry run:"),
        "{:?}",
        report.captured.denied
    );

    let plan = call(&host, &bad, &grants, "exec", &params("plan"), true);
    let o = plan.result.unwrap_or_else(|e| {
        panic!(
            "a dryRun grant must run in a dry run: {} {}",
            e.code, e.message
        )
    });
    assert!(
        o.message.contains("exit 0") && o.message.contains("plan"),
        "{}",
        o.message
    );

    // Not a dry run: both run.
    let apply = call(&host, &bad, &grants, "exec", &params("apply"), false);
    assert!(apply.result.is_ok(), "{:?}", apply.result);
    // Arguments no grant admits are refused as ever, naming the patterns, not the dry run.
    let (e, _) = refused(&host, &bad, &grants, "exec", &params("other"));
    assert!(
        e.message.contains("match none of the granted patterns"),
        "{}",
        e.message
    );
}

#[test]
fn a_dry_run_changes_no_service_but_may_read_its_status() {
    let node = node();
    let host = node.host();
    let good = node.load(&host, &plugins().good, "good");
    let grants = Grants {
        services: vec![ServiceGrant {
            unit: "kubelet.service".into(),
            actions: vec![
                ServiceAction::Restart,
                ServiceAction::Stop,
                ServiceAction::Start,
                ServiceAction::Reload,
            ],
        }],
        ..Grants::default()
    };
    for action in ["restart", "stop", "start", "reload"] {
        let params = format!(r#"{{"unit":"kubelet.service","action":"{action}"}}"#);
        let r = call(&host, &good, &grants, "service", &params, true);
        let e = r
            .result
            .expect_err("a service change in a dry run must be refused");
        assert_eq!(e.code, "not-granted", "{action}: {}", e.message);
        assert!(
            e.message
                .contains(&format!("dry run: {action} kubelet.service")),
            "{}",
            e.message
        );
    }
    let status = call(
        &host,
        &good,
        &grants,
        "service",
        r#"{"unit":"kubelet.service","action":"status"}"#,
        true,
    );
    assert!(status.result.is_ok(), "{:?}", status.result);
    // Only the status call reached the backend.
    assert_eq!(node.services.calls(), ["status kubelet.service"]);
    let wet = call(
        &host,
        &good,
        &grants,
        "service",
        r#"{"unit":"kubelet.service","action":"restart"}"#,
        false,
    );
    assert!(wet.result.is_ok(), "{:?}", wet.result);
    assert_eq!(
        node.services.calls(),
        ["status kubelet.service", "restart kubelet.service"]
    );
}

#[test]
fn a_dry_run_preflight_is_held_to_the_same_rules() {
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    let grants = Grants {
        filesystem: vec![fs("/rw", Access::ReadWrite)],
        ..Grants::default()
    };
    let params = r#"{"path":"/rw/x"}"#;
    // `bad`'s preflight of `write` tries to write and reports what happened as a check.
    let pre = host
        .preflight_with(&bad, &grants, &ctx(), "write", params, true)
        .unwrap();
    let checks = pre.result.unwrap();
    assert_eq!(checks[0].name, "preflight-write");
    assert!(
        checks[0].message.starts_with("io:PermissionDenied")
            || checks[0].message.starts_with("io:ReadOnlyFilesystem"),
        "{}",
        checks[0].message
    );
    assert!(
        !node.root().join("rw/x").exists(),
        "a dry-run preflight wrote to the node"
    );
    // The preflight of a normal run has the grant as given.
    let wet = host
        .preflight(&bad, &grants, &ctx(), "write", params)
        .unwrap();
    assert!(wet.result.unwrap()[0].message.starts_with("ESCAPED"));
    assert!(node.root().join("rw/x").exists());
}

/// A dry-run-safe command's `ReadWrite` sandbox path is read-only in a dry run, unless the
/// grant marks it `writableInDryRun` (dnf's log directory): then that path alone is
/// writable, and only for that grant's command. The kernel enforces it (Landlock), so the
/// command's own write is what is refused or let through.
#[test]
fn a_dry_run_command_writes_only_where_its_grant_says_writable_in_dry_run() {
    support::require_root("a_dry_run_command_writes_only_where_its_grant_says_writable_in_dry_run");
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    std::fs::create_dir_all(node.root().join("logs")).unwrap();
    let script = "echo logged >> /logs/tool.log && echo changed >> /rw/state";
    let grants_with = |writable_in_dry_run: bool| {
        let mut g = exec_grant("/bin/sh", &[&["-c", script]]);
        g.dry_run = true;
        for (path, writable_in_dry_run) in [("/logs", writable_in_dry_run), ("/rw", false)] {
            g.sandbox.filesystem.push(bosun_api::grants::CommandPath {
                path: path.into(),
                access: Access::ReadWrite,
                execute: false,
                optional: false,
                writable_in_dry_run,
            });
        }
        Grants {
            exec: vec![g],
            ..Grants::default()
        }
    };
    let params = serde_json::json!({"command": "/bin/sh", "args": ["-c", script]}).to_string();
    let read = |p: &str| std::fs::read_to_string(node.root().join(p)).unwrap_or_default();

    // The shell's exit code after a refused redirection: 2 for dash, 1 for bash.
    let refused_write = |writable_in_dry_run: bool| {
        let report = call(
            &host,
            &bad,
            &grants_with(writable_in_dry_run),
            "exec",
            &params,
            true,
        );
        let message = format!("{:?}", report.result);
        assert!(
            message.contains("exit 1") || message.contains("exit 2"),
            "{message}"
        );
    };

    // Unmarked: the log write is refused by the kernel, and nothing after it runs.
    refused_write(false);
    assert_eq!(
        (read("logs/tool.log"), read("rw/state")),
        (String::new(), String::new())
    );

    // Marked: the log is written; the other ReadWrite path stays read-only.
    refused_write(true);
    assert_eq!(
        (read("logs/tool.log"), read("rw/state")),
        ("logged\n".into(), String::new())
    );

    // Not a dry run: both are written.
    let report = call(&host, &bad, &grants_with(true), "exec", &params, false);
    assert!(
        format!("{:?}", report.result).contains("exit 0"),
        "{:?}",
        report.result
    );
    assert_eq!(
        (read("logs/tool.log"), read("rw/state")),
        ("logged\nlogged\n".into(), "changed\n".into())
    );
}

/// Hostile shapes of a `writableInDryRun` path: a marked path that is a symlink to another
/// directory (refused before the command starts, naming the link and its target; before,
/// the rule landed on the link itself and the kernel let nothing be written through it,
/// but nothing said why), a marked path that climbs out with
/// `..` (refused as a grant), and a marked path on a grant without `dryRun` (refused as a
/// grant). In each, the directory the shape aims at is left unchanged.
#[test]
fn writable_in_dry_run_paths_do_not_reach_past_themselves() {
    support::require_root("writable_in_dry_run_paths_do_not_reach_past_themselves");
    let node = node();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    std::os::unix::fs::symlink("rw", node.root().join("logs")).unwrap();
    let script = "echo pwned >> /logs/x; echo pwned >> /rw/x";
    let params = serde_json::json!({"command": "/bin/sh", "args": ["-c", script]}).to_string();
    let with_path = |path: &str, dry_run: bool| {
        let mut g = exec_grant("/bin/sh", &[&["-c", script]]);
        g.dry_run = dry_run;
        g.sandbox.filesystem.push(bosun_api::grants::CommandPath {
            path: path.into(),
            access: Access::ReadWrite,
            execute: false,
            optional: false,
            writable_in_dry_run: true,
        });
        Grants {
            exec: vec![g],
            ..Grants::default()
        }
    };
    // The symlink: the command does not start.
    let report = call(
        &host,
        &bad,
        &with_path("/logs", true),
        "exec",
        &params,
        true,
    );
    let message = format!("{:?}", report.result);
    assert!(
        message.contains(
            "the exec grant's sandbox names /logs is a symlink (to rw); name the real path"
        ),
        "{message}"
    );
    assert!(
        !node.root().join("rw/x").exists(),
        "the command wrote through a symlinked writableInDryRun path"
    );
    for (path, dry_run, refusal) in [
        ("/logs/../rw", true, "has `.` or `..` components"),
        (
            "/rw",
            false,
            "writableInDryRun needs `access: ReadWrite` on a grant with `dryRun: true`",
        ),
    ] {
        // An invalid grant fails the whole call, before the plugin runs.
        let failure = host
            .run(
                &bad,
                &with_path(path, dry_run),
                &ctx(),
                "exec",
                &params,
                RunOptions {
                    dry_run: true,
                    resumed: false,
                    deadline: Some(Duration::from_secs(60)),
                },
            )
            .err()
            .unwrap_or_else(|| panic!("{path}: the grant was accepted"))
            .to_string();
        assert!(failure.contains(refusal), "{path}: {failure}");
        assert!(
            !node.root().join("rw/x").exists(),
            "{path}: the command wrote through the shape"
        );
    }
}
