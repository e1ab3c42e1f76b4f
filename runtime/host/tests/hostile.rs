//! The defects of the security review (issue 18), each as the attack that worked: a
//! signed plugin treated as hostile must not get the host to execute or follow anything
//! it could have written, and every host call ends at the run's deadline. Each test
//! names the review item it closes; see docs/security.md.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use bosun_api::grants::{Access, Grants};
use bosun_host::{Host, LoadedPlugin, NodeContext, PluginError, RunReport};
use support::{Node, exec_grant, fs, node, plugins, run_on};

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
    params: &serde_json::Value,
) -> RunReport {
    run_on(host, p, grants, &ctx(), action, &params.to_string())
        .unwrap_or_else(|f| panic!("{action} {params}: host failure {f}"))
}

fn output(report: &RunReport, key: &str) -> String {
    let outcome = report
        .result
        .as_ref()
        .unwrap_or_else(|e| panic!("expected an outcome, got {e:?}"));
    outcome
        .outputs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no output {key}"))
}

fn write_executable(path: &Path, content: &[u8]) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, content).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A kubeadm stand-in that, if anything ever runs it, leaves `/ran-kubeadm` in the root
/// (chrooted) or next to the test's working directory (not chrooted).
const TRAP_KUBEADM: &str = "#!/bin/sh\necho ran > /ran-kubeadm\necho v9.9.9\n";

fn kubeadm_ran(node: &Node) -> bool {
    node.root().join("ran-kubeadm").exists() || Path::new("/ran-kubeadm").exists()
}

// ------------------------------------------------------------ items 3 and 4: facts

#[test]
fn item3_facts_never_execute_a_kubeadm_the_plugin_replaced() {
    let node = node();
    write_executable(
        &node.root().join("usr/bin/kubeadm"),
        b"#!/bin/sh\necho v1.0.0\n",
    );
    let host = node.host();
    let good = node.load(&host, &plugins().good, "good");
    // The review's attack: with only a read-write /usr/bin grant, overwrite kubeadm (the
    // mode stays 0755), then ask for facts, which need no grant.
    let rw_bin = Grants {
        filesystem: vec![fs("/usr/bin", Access::ReadWrite)],
        ..Grants::default()
    };
    let wrote = run(
        &host,
        &good,
        &rw_bin,
        "write",
        &serde_json::json!({"path": "/usr/bin/kubeadm", "content": TRAP_KUBEADM}),
    );
    assert!(wrote.result.is_ok(), "{:?}", wrote.result);
    for _ in 0..3 {
        let facts = run(
            &host,
            &good,
            &Grants::default(),
            "facts",
            &serde_json::json!({}),
        );
        // A shell script has no version string to read: the fact is unknown, not `v9.9.9`.
        assert_eq!(output(&facts, "kubeadm"), "");
    }
    assert!(
        !kubeadm_ran(&node),
        "the host executed the kubeadm a plugin wrote"
    );
}

#[test]
fn item3_the_kubeadm_version_is_read_from_the_binary_or_the_dpkg_database() {
    let node = node();
    // What a Go build with `-X .../version.gitVersion=v1.34.4` in two packages holds.
    let mut binary = b"\x7fELF padding\0".to_vec();
    binary.extend_from_slice(b"v1.33.0 literal without a twin\0\0");
    binary.extend_from_slice(b"v1.34.4\0v1.34.4\0");
    binary.extend_from_slice(b"#!/bin/sh\necho ran > /ran-kubeadm\n");
    write_executable(&node.root().join("usr/bin/kubeadm"), &binary);
    let host = node.host();
    let good = node.load(&host, &plugins().good, "good");
    let facts = run(
        &host,
        &good,
        &Grants::default(),
        "facts",
        &serde_json::json!({}),
    );
    assert_eq!(output(&facts, "kubeadm"), "v1.34.4");
    assert_eq!(
        host.node_facts(&ctx(), Duration::from_secs(5))
            .kubeadm_version
            .as_deref(),
        Some("v1.34.4")
    );
    // An installed dpkg package wins (epoch and Debian revision dropped).
    let status = "Package: kubelet\nStatus: install ok installed\nVersion: 1.34.9-1.1\n\n\
                  Package: kubeadm\nStatus: install ok installed\nVersion: 1:1.35.0-1.1\n";
    std::fs::create_dir_all(node.root().join("var/lib/dpkg")).unwrap();
    std::fs::write(node.root().join("var/lib/dpkg/status"), status).unwrap();
    let facts = run(
        &host,
        &good,
        &Grants::default(),
        "facts",
        &serde_json::json!({}),
    );
    assert_eq!(output(&facts, "kubeadm"), "v1.35.0");
    assert!(!kubeadm_ran(&node));
}

#[test]
fn item3_a_kubeadm_symlink_is_not_followed_for_its_version() {
    let node = node();
    let mut binary = b"\0v1.34.4\0v1.34.4\0".to_vec();
    binary.extend_from_slice(b"more");
    write_executable(&node.root().join("opt/kubeadm"), &binary);
    std::os::unix::fs::symlink("../../opt/kubeadm", node.root().join("usr/bin/kubeadm")).unwrap();
    let host = node.host();
    assert_eq!(
        host.node_facts(&ctx(), Duration::from_secs(5))
            .kubeadm_version,
        None
    );
}

#[test]
fn item4_describe_gets_no_node_facts() {
    let node = node();
    write_executable(
        &node.root().join("usr/bin/kubeadm"),
        TRAP_KUBEADM.as_bytes(),
    );
    let host = node.host();
    // `bad` asks for facts inside describe; the host refuses, so describe neither reads
    // the node nor runs anything on it.
    let bad = node.load(&host, &plugins().bad, "bad");
    assert!(
        bad.metadata()
            .description
            .ends_with("facts in describe: refused"),
        "{}",
        bad.metadata().description
    );
    assert!(!kubeadm_ran(&node));
}

// ------------------------------------------------------------ item 6: exec and symlinks

/// `/usr/bin/show FILE` prints FILE with shell builtins only (the test root has no cat).
const SHOW: &str = "#!/bin/sh\nwhile IFS= read -r line; do echo \"$line\"; done < \"$1\"\n";

fn exec(
    host: &Host,
    bad: &LoadedPlugin,
    grants: &Grants,
    command: &str,
    args: &[&str],
) -> Result<String, PluginError> {
    let report = run(
        host,
        bad,
        grants,
        "exec",
        &serde_json::json!({"command": command, "args": args}),
    );
    report.result.map(|o| o.message)
}

#[test]
fn item6_granted_commands_do_not_follow_symlinks_in_their_arguments() {
    let node = node();
    let root = node.root();
    write_executable(&root.join("usr/bin/show"), SHOW.as_bytes());
    std::fs::write(root.join("etc/shadow"), "root:SECRET-HASH:1::::::\n").unwrap();
    std::fs::create_dir_all(root.join("var/lib/foo")).unwrap();
    std::fs::write(root.join("var/lib/foo/plain"), "plain content\n").unwrap();
    // What a plugin with a read-write /var/lib/foo grant can make (WASI accepts relative
    // targets): a link climbing to the node's shadow file, and a link to a directory.
    std::os::unix::fs::symlink("../../../etc/shadow", root.join("var/lib/foo/x")).unwrap();
    std::os::unix::fs::symlink("../../../etc", root.join("var/lib/foo/d")).unwrap();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    let grants = Grants {
        filesystem: vec![fs("/var/lib/foo", Access::ReadWrite)],
        exec: vec![exec_grant("/usr/bin/show", &[&["/var/lib/foo/*"], &["**"]])],
        ..Grants::default()
    };
    let ok = exec(
        &host,
        &bad,
        &grants,
        "/usr/bin/show",
        &["/var/lib/foo/plain"],
    )
    .unwrap();
    assert!(ok.contains("plain content"), "{ok}");
    for args in [
        &["/var/lib/foo/x"][..],
        &["var/lib/foo/x"],
        &["/var/lib/foo/d/shadow"],
    ] {
        match exec(&host, &bad, &grants, "/usr/bin/show", args) {
            Err(e) => {
                assert_eq!(e.code, "host:not-granted", "{args:?}: {}", e.message);
                assert!(
                    e.message.contains("goes through the symlink /var/lib/foo/"),
                    "{args:?}: {}",
                    e.message
                );
            }
            Ok(m) => panic!("{args:?} was followed: {m}"),
        }
    }
    // A path that does not exist yet has nothing to follow.
    let missing = exec(&host, &bad, &grants, "/usr/bin/show", &["/var/lib/foo/new"]).unwrap();
    assert!(!missing.contains("SECRET"), "{missing}");
}

#[test]
fn item6_a_granted_command_that_is_a_symlink_is_refused() {
    let node = node();
    let root = node.root();
    write_executable(&root.join("usr/bin/show"), SHOW.as_bytes());
    // A plugin with a read-write /usr/bin grant turns a granted command into a link to
    // another program.
    std::os::unix::fs::symlink("show", root.join("usr/bin/kubeadm")).unwrap();
    std::fs::write(root.join("etc/shadow"), "root:SECRET-HASH:1::::::\n").unwrap();
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    let grants = Grants {
        exec: vec![exec_grant("/usr/bin/kubeadm", &[&["**"]])],
        ..Grants::default()
    };
    match exec(&host, &bad, &grants, "/usr/bin/kubeadm", &["etc/shadow"]) {
        Err(e) => assert!(
            e.message
                .contains("the command goes through the symlink /usr/bin/kubeadm -> show"),
            "{}",
            e.message
        ),
        Ok(m) => panic!("the linked command ran: {m}"),
    }
}

// ------------------------------------------------------------ item 2: FIFOs

/// Runs `f` on another thread and fails the test if it has not returned after `limit`
/// (a hang would otherwise hold the test binary for ever; this is not a timing assertion,
/// the call is expected to return long before).
fn returns<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("the host call did not return within {limit:?}: it hangs"))
}

#[test]
fn item2_opening_a_fifo_or_device_in_a_granted_directory_is_refused_not_hung() {
    let node = node();
    let root = node.root();
    let made = Command::new("mkfifo")
        .arg(root.join("data/pipe"))
        .status()
        .unwrap();
    assert!(made.success());
    std::os::unix::fs::symlink("pipe", root.join("data/pipe-link")).unwrap();
    let dev_null = if Command::new("mknod")
        .arg(root.join("data/null"))
        .args(["c", "1", "3"])
        .status()
        .is_ok_and(|s| s.success())
    {
        Some("/data/null")
    } else {
        None
    };
    let host = std::sync::Arc::new(node.host());
    let bad = node.load(&host, &plugins().bad, "bad");
    let grants = Grants {
        filesystem: vec![fs("/data", Access::ReadOnly)],
        ..Grants::default()
    };
    let mut paths = vec!["/data/pipe", "/data/pipe-link"];
    paths.extend(dev_null);
    for path in paths {
        let (h, b, g) = (host.clone(), bad.clone(), grants.clone());
        let report = returns(Duration::from_secs(120), move || {
            run(&h, &b, &g, "read", &serde_json::json!({"path": path}))
        });
        match report.result {
            Err(e) => assert_eq!(e.code, "io:PermissionDenied", "{path}: {}", e.message),
            Ok(o) => panic!("{path} was opened: {}", o.message),
        }
    }
    // Regular files in the same grant still read.
    let report = run(
        &host,
        &bad,
        &grants,
        "read",
        &serde_json::json!({"path": "/data/input.txt"}),
    );
    assert!(
        report
            .result
            .unwrap()
            .message
            .contains("hello from the node")
    );
}

// ------------------------------------------------------------ also seen: daemons

/// Copies `bin` and the libraries `ldd` lists for it into `root`.
fn install(root: &Path, bin: &str) {
    let mut files = vec![PathBuf::from(bin)];
    let ldd = Command::new("ldd").arg(bin).output().expect("ldd");
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        let path = line
            .split("=>")
            .last()
            .unwrap_or(line)
            .split_whitespace()
            .next()
            .unwrap_or("");
        if path.starts_with('/') {
            files.push(PathBuf::from(path));
        }
    }
    for f in files {
        let dest = root.join(f.strip_prefix("/").unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(f.canonicalize().unwrap(), &dest).unwrap();
    }
}

/// Processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .collect()
}

#[test]
fn also_seen_a_daemon_started_by_a_granted_command_dies_with_it() {
    // Chrooted commands and the PID namespace need root; fail instead of skipping.
    support::require_root("also_seen_a_daemon_started_by_a_granted_command_dies_with_it");
    let node = node();
    let root = node.root();
    let (setsid, sleep) = ("/usr/bin/setsid", "/bin/sleep");
    install(&root, setsid);
    install(&root, sleep);
    // A unique duration marks the daemon among the machine's processes. The command
    // returns only once the daemon has left its process group (setsid done), so the
    // group kill at the command's exit cannot be what stops it.
    let marker = format!("3600.{}", std::process::id());
    write_executable(
        &root.join("usr/bin/daemonize"),
        format!(
            "#!/bin/sh\n: > /run/daemon-ready\n{setsid} /bin/sh -c 'echo ready > /run/daemon-ready; exec {sleep} {marker}' &\n\
             while [ ! -s /run/daemon-ready ]; do :; done\necho started\n"
        )
        .as_bytes(),
    );
    // sh starts a background job with stdin from /dev/null.
    std::fs::create_dir_all(root.join("dev")).unwrap();
    assert!(
        Command::new("mknod")
            .arg(root.join("dev/null"))
            .args(["c", "1", "3"])
            .status()
            .unwrap()
            .success()
    );
    let host = node.host();
    let bad = node.load(&host, &plugins().bad, "bad");
    let mut grant = exec_grant("/usr/bin/daemonize", &[]);
    grant.timeout_seconds = Some(10);
    // The one place the daemon and the command write their handshake.
    std::fs::create_dir_all(root.join("run")).unwrap();
    grant
        .sandbox
        .filesystem
        .push(bosun_api::grants::CommandPath {
            path: "/run".into(),
            access: Access::ReadWrite,
            execute: false,
            optional: false,
            writable_in_dry_run: false,
        });
    let grants = Grants {
        exec: vec![grant],
        ..Grants::default()
    };
    let out = exec(&host, &bad, &grants, "/usr/bin/daemonize", &[]);
    let left = processes_with(&marker);
    for pid in &left {
        let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
    }
    assert!(
        matches!(&out, Ok(m) if m.contains("started")),
        "the daemonizing command ran: {out:?}"
    );
    assert!(
        left.is_empty(),
        "the daemon outlived the command: pids {left:?}"
    );
}
