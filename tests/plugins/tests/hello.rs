//! The `hello` example (the demo's plugin) on the layout of a real Debian or RHEL node,
//! where `/etc/os-release` is a symlink to `../usr/lib/os-release` (issue 39): with the
//! example's grants (`/etc` read-only) the host does not follow the link out of the grant,
//! says so, and the plugin greets the node with the OS name of its facts.

use bosun_host::CheckStatus;
use bosun_plugins_tests::{Node, grants_of, install_programs, plugins, workspace_root, write};
use serde_json::json;

#[test]
fn hello_greets_a_node_whose_os_release_is_a_symlink_out_of_its_grant() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    write(
        &root,
        "usr/lib/os-release",
        "PRETTY_NAME=\"Debian GNU/Linux 13 (trixie)\"\nNAME=\"Debian GNU/Linux\"\nID=debian\nVERSION_ID=\"13\"\n",
    );
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::os::unix::fs::symlink("../usr/lib/os-release", root.join("etc/os-release")).unwrap();
    std::os::unix::fs::symlink("../usr/lib/os-release", root.join("etc/other-release")).unwrap();
    install_programs(&root, &["/usr/bin/uname"]);
    let node = Node::new(&root, &["worker"]);
    let hello = node.load(&plugins().hello, "hello");
    let grants = grants_of(&workspace_root().join("deploy/examples/plugin-hello.yaml"));

    let ran = node.run(&hello, &grants, "greet", &json!({}), false);
    let check = ran
        .checks
        .iter()
        .find(|c| c.name == "file-readable")
        .unwrap();
    assert_eq!(check.status, CheckStatus::Warn, "{check:?}");
    assert!(
        check
            .message
            .contains("a symlink leading out of the plugin's grants"),
        "{check:?}"
    );
    let outcome = ran.outcome();
    assert!(
        outcome.message.contains("Debian GNU/Linux 13 (trixie)"),
        "{}",
        outcome.message
    );
    // The host says which link, and where it leads, where the plugin only saw "not permitted".
    let denied = &ran.run.as_ref().unwrap().captured.denied;
    assert!(
        denied.iter().any(|d| d.capability == "filesystem"
            && d.message.contains(
                "`os-release` (in a granted directory) is a symlink to `../usr/lib/os-release`, which leads out of that grant"
            )),
        "{denied:?}"
    );

    // Another file behind such a link has no fallback: the check fails and says why.
    let ran = node.run(
        &hello,
        &grants,
        "greet",
        &json!({"file": "/etc/other-release"}),
        false,
    );
    let check = ran
        .checks
        .iter()
        .find(|c| c.name == "file-readable")
        .unwrap();
    assert_eq!(check.status, CheckStatus::Fail, "{check:?}");
    assert!(
        check
            .message
            .contains("a symlink leading out of the plugin's grants"),
        "{check:?}"
    );
    assert!(
        !check
            .message
            .contains("needs a filesystem grant covering `/etc`"),
        "the old message blamed the grant: {check:?}"
    );
}
