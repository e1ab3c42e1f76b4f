//! Filesystem grants against symlinks in the host root, and node facts against hostile
//! files: real plugins in a real host on a temporary root (see support/mod.rs).
//!
//! A grant must name a real directory: a path through a symlink anywhere below the host
//! root is refused with the real path to grant instead, so what is preopened is exactly
//! what was granted and the read-only-inside-read-write check compares real paths.

use crate::support;

use std::os::unix::fs::symlink;

use bosun_api::grants::{Access, FilesystemGrant, Grants};
use bosun_host::{CallFailure, Error, Host, LoadedPlugin, NodeContext, RunReport};
use support::{Node, fs, node, plugins, run_on};

fn grants(filesystem: Vec<FilesystemGrant>) -> Grants {
    Grants {
        filesystem,
        ..Grants::default()
    }
}

fn run(
    host: &Host,
    p: &LoadedPlugin,
    grants: &Grants,
    action: &str,
    params: &str,
) -> Result<RunReport, CallFailure> {
    run_on(host, p, grants, &NodeContext::default(), action, params)
}

/// The reason of the `InvalidGrant` the host stops the run with; panics on anything else.
fn refused_grant(r: Result<RunReport, CallFailure>) -> String {
    match r {
        Ok(report) => panic!(
            "the grants were accepted and the plugin ran: {:?}",
            report.result
        ),
        Err(CallFailure {
            error: Error::InvalidGrant { grant, reason },
            ..
        }) => format!("{grant}: {reason}"),
        Err(f) => panic!("expected an invalid grant, got {f}"),
    }
}

/// What the `bad` plugin's `read` action read (it reports a successful read as an
/// escape; here the file is granted, so reading it is expected).
fn read_through(node: &Node, host: &Host, grants: &Grants, path: &str) -> String {
    let bad = node.load(host, &plugins().bad, "bad");
    let report = run(
        host,
        &bad,
        grants,
        "read",
        &format!(r#"{{"path":"{path}"}}"#),
    )
    .unwrap();
    let outcome = report
        .result
        .unwrap_or_else(|e| panic!("reading {path}: {e:?}"));
    // "ESCAPED: read N bytes from PATH: CONTENT"
    match outcome.message.split_once(&format!("{path}: ")) {
        Some((_, content)) => content.to_owned(),
        None => panic!("unexpected read report: {}", outcome.message),
    }
}

/// Makes the node's root merged-/usr: what is in `/lib` (the shell's libraries) moves to
/// `/usr/lib` and `/lib -> usr/lib`; adds `/usr/lib/modules/version`.
fn merged_usr(node: &Node) {
    let root = node.root();
    std::fs::create_dir_all(root.join("usr/lib/modules")).unwrap();
    std::fs::write(root.join("usr/lib/modules/version"), "6.1.0\n").unwrap();
    if let Ok(entries) = std::fs::read_dir(root.join("lib")) {
        for entry in entries {
            let entry = entry.unwrap();
            std::fs::rename(entry.path(), root.join("usr/lib").join(entry.file_name())).unwrap();
        }
        std::fs::remove_dir(root.join("lib")).unwrap();
    }
    symlink("usr/lib", root.join("lib")).unwrap();
}

#[test]
fn a_read_only_grant_through_a_symlink_into_a_read_write_grant_is_refused() {
    let node = node();
    merged_usr(&node);
    let host = node.host();
    let good = node.load(&host, &plugins().good, "good");
    // The written paths do not nest, but /lib/modules is /usr/lib/modules: it would be
    // writable through the /usr/lib preopen.
    let both = grants(vec![
        fs("/usr/lib", Access::ReadWrite),
        fs("/lib/modules", Access::ReadOnly),
    ]);
    let e = refused_grant(run(&host, &good, &both, "noop", "{}"));
    assert!(e.contains("/lib/modules"), "names the grant: {e}");
    assert!(
        e.contains("the symlink /lib -> usr/lib"),
        "names the symlink: {e}"
    );
    assert!(
        e.contains("grant the real path /usr/lib/modules"),
        "says what to grant: {e}"
    );
    // Alone it is refused just the same: no grant goes through a symlink.
    let e = refused_grant(run(
        &host,
        &good,
        &grants(vec![fs("/lib/modules", Access::ReadOnly)]),
        "noop",
        "{}",
    ));
    assert!(e.contains("the symlink /lib -> usr/lib"), "{e}");
    // Granting the real paths as suggested makes the overlap visible and refused too.
    let real = grants(vec![
        fs("/usr/lib", Access::ReadWrite),
        fs("/usr/lib/modules", Access::ReadOnly),
    ]);
    let e = refused_grant(run(&host, &good, &real, "noop", "{}"));
    assert!(e.contains("inside the read-write grant /usr/lib"), "{e}");
    // The same directory twice with different access, once through the symlink.
    let twice = grants(vec![
        fs("/usr/lib/modules", Access::ReadOnly),
        fs("/lib/modules", Access::ReadWrite),
    ]);
    let e = refused_grant(run(&host, &good, &twice, "noop", "{}"));
    assert!(e.contains("the symlink /lib -> usr/lib"), "{e}");
}

#[test]
fn a_granted_directory_replaced_by_a_symlink_is_refused_on_the_next_run() {
    let node = node();
    let root = node.root();
    std::fs::create_dir_all(root.join("var/lib/pd/sub")).unwrap();
    std::fs::write(root.join("etc/shadow"), "root:secret-hash\n").unwrap();
    let host = node.host();
    let good = node.load(&host, &plugins().good, "good");
    let sub = grants(vec![fs("/var/lib/pd/sub", Access::ReadWrite)]);
    run(
        &host,
        &good,
        &sub,
        "write",
        r#"{"path":"/var/lib/pd/sub/state","content":"1"}"#,
    )
    .unwrap()
    .result
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(root.join("var/lib/pd/sub/state")).unwrap(),
        "1"
    );

    // What a plugin (or a granted command) with write access to /var/lib/pd can do:
    // swap the granted subdirectory for a link that stays inside the root but leads to /etc.
    std::fs::remove_dir_all(root.join("var/lib/pd/sub")).unwrap();
    symlink("../../../etc", root.join("var/lib/pd/sub")).unwrap();
    assert!(
        root.join("var/lib/pd/sub/shadow").is_file(),
        "the link does lead to the root's /etc"
    );

    let e = refused_grant(run(
        &host,
        &good,
        &sub,
        "write",
        r#"{"path":"/var/lib/pd/sub/shadow","content":"pwned"}"#,
    ));
    assert!(e.contains("/var/lib/pd/sub"), "names the grant: {e}");
    assert!(
        e.contains("the symlink /var/lib/pd/sub -> ../../../etc"),
        "names the symlink: {e}"
    );
    assert!(
        e.contains("grant the real path /etc"),
        "says where it really leads: {e}"
    );
    let read_only = grants(vec![fs("/var/lib/pd/sub", Access::ReadOnly)]);
    refused_grant(run(&host, &good, &read_only, "noop", "{}"));
    assert_eq!(
        std::fs::read_to_string(root.join("etc/shadow")).unwrap(),
        "root:secret-hash\n"
    );

    // A link out of the root (absolute or climbing) has no real path inside it to offer.
    std::fs::remove_file(root.join("var/lib/pd/sub")).unwrap();
    symlink(node.outside(), root.join("var/lib/pd/sub")).unwrap();
    let e = refused_grant(run(&host, &good, &read_only, "noop", "{}"));
    assert!(
        e.contains("does not lead to a directory inside the host root"),
        "{e}"
    );

    // The parent grant itself is a real directory and still works; inside it the link
    // is confined by the preopen as before.
    let parent = grants(vec![fs("/var/lib/pd", Access::ReadWrite)]);
    run(
        &host,
        &good,
        &parent,
        "write",
        r#"{"path":"/var/lib/pd/new","content":"2"}"#,
    )
    .unwrap()
    .result
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(root.join("var/lib/pd/new")).unwrap(),
        "2"
    );
    assert!(!node.outside().join("new").exists());
}

#[test]
fn plain_directory_grants_still_work() {
    let node = node();
    merged_usr(&node);
    let host = node.host();
    let good = node.load(&host, &plugins().good, "good");
    // The real path the refusal above suggests, read-only, next to a read-write sibling.
    let g = grants(vec![
        fs("/usr/lib/modules", Access::ReadOnly),
        fs("/rw", Access::ReadWrite),
        fs("/data", Access::ReadOnly),
    ]);
    assert_eq!(
        read_through(&node, &host, &g, "/usr/lib/modules/version"),
        "6.1.0\n"
    );
    assert_eq!(
        read_through(&node, &host, &g, "/data/input.txt"),
        "hello from the node"
    );
    run(
        &host,
        &good,
        &g,
        "write",
        r#"{"path":"/rw/out.txt","content":"ok"}"#,
    )
    .unwrap()
    .result
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(node.root().join("rw/out.txt")).unwrap(),
        "ok"
    );
    // The same grant twice is one preopen, and the whole root may be granted.
    let dup = grants(vec![
        fs("/data", Access::ReadOnly),
        fs("/data", Access::ReadOnly),
    ]);
    assert_eq!(
        read_through(&node, &host, &dup, "/data/input.txt"),
        "hello from the node"
    );
    let whole = grants(vec![fs("/", Access::ReadOnly)]);
    assert_eq!(
        read_through(&node, &host, &whole, "/usr/lib/modules/version"),
        "6.1.0\n"
    );
}

#[test]
fn a_host_root_reached_through_a_symlink_is_fine() {
    // Only symlinks below the root count: the root itself is canonicalized first.
    let node = node();
    merged_usr(&node);
    let link = node.dir.path().join("root-link");
    symlink(node.root(), &link).unwrap();
    let mut config = node.config();
    config.host_root = link;
    let host = Host::new(config).unwrap();
    let g = grants(vec![fs("/usr/lib/modules", Access::ReadOnly)]);
    assert_eq!(
        read_through(&node, &host, &g, "/usr/lib/modules/version"),
        "6.1.0\n"
    );
}

#[test]
fn facts_do_not_follow_an_os_release_symlink_out_of_the_root() {
    // A plugin with write access to /etc could plant this; facts.node() must not read
    // the agent's own files through it.
    let node = node();
    std::fs::write(node.outside().join("os-release"), "ID=outside\n").unwrap();
    std::fs::remove_file(node.root().join("etc/os-release")).unwrap();
    symlink(
        node.outside().join("os-release"),
        node.root().join("etc/os-release"),
    )
    .unwrap();
    std::fs::create_dir_all(node.root().join("usr/lib")).unwrap();
    std::fs::write(node.root().join("usr/lib/os-release"), "ID=inside\n").unwrap();
    let host = node.host();
    let good = node.load(&host, &plugins().good, "good");
    let o = run(&host, &good, &Grants::default(), "facts", "{}")
        .unwrap()
        .result
        .unwrap();
    let os_id = o
        .outputs
        .iter()
        .find(|(k, _)| k == "os-id")
        .map(|(_, v)| v.as_str());
    // The refused file reads as missing, so the /usr/lib fallback is used.
    assert_eq!(os_id, Some("inside"));
}
