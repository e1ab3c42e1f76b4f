//! The `etcd` plugin through the real sandbox (kernel boundary included) with the grants of
//! deploy/examples/plugins/etcd.yaml, against a node root whose `etcdctl` and `etcdutl` are
//! simulated (tests/plugins/src/lib.rs, `simulated_etcd`): the health verdicts a person
//! reads, the snapshot written by the command into the snapshot directory, verified,
//! hashed and pruned, a dry run that writes nothing, and a missing snapshot directory
//! refused in preflight with what to do. The real etcdctl and etcdutl against a real
//! three-member etcd run in the real-node stage (tests/cluster/test-bosun-upgrade.sh).

use std::path::{Path, PathBuf};

use bosun_plugins_tests::{Node, SimulatedEtcd, example_grants, plugins, simulated_etcd, write};
use serde_json::json;
use sha2::{Digest, Sha256};

const MEMBERS: [&str; 3] = ["cp1@10.0.0.1", "cp2@10.0.0.2", "cp3@10.0.0.3"];

fn root(down: &[&str]) -> (tempfile::TempDir, PathBuf, SimulatedEtcd) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    write(&root, "etc/os-release", "ID=debian\nVERSION_ID=12\n");
    let etcd = simulated_etcd(&root, &MEMBERS, down);
    (dir, root, etcd)
}

fn snapshots(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root.join("var/lib/etcd-snapshots"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn health_passes_or_names_the_member_and_its_fault() {
    let grants = example_grants("etcd.yaml");
    // (members down, expected members, the message's start, or None for healthy)
    let cases: [(&[&str], u32, Option<&str>); 3] = [
        (&[], 3, None),
        (
            &["10.0.0.2"],
            3,
            Some(
                "etcd is not healthy, so this control plane is not touched: member cp2 (https://10.0.0.2:2379) is not healthy: context deadline exceeded",
            ),
        ),
        (
            &[],
            4,
            Some(
                "etcd is not healthy, so this control plane is not touched: etcd has 3 members (cp1 (https://10.0.0.1:2379), cp2 (https://10.0.0.2:2379), cp3 (https://10.0.0.3:2379)) and the cluster 4 control-plane Nodes",
            ),
        ),
    ];
    for (down, expected, want) in cases {
        let (_dir, root, _etcd) = root(down);
        let node = Node::new(&root, &["control-plane"]);
        let etcd = node.load(&plugins().etcd, "etcd");
        let params = json!({"expectedMembers": expected, "waitSeconds": 0});
        // In a dry run too: the queries only read, and their grant says so.
        for dry_run in [false, true] {
            let ran = node.run(&etcd, &grants, "health", &params, dry_run);
            match want {
                None => {
                    let o = ran.outcome();
                    assert!(!o.changed);
                    assert_eq!(
                        o.message,
                        "etcd is healthy: 3 members (cp1 (https://10.0.0.1:2379), cp2 (https://10.0.0.2:2379), cp3 (https://10.0.0.3:2379)), leader cp1 (https://10.0.0.1:2379), no alarm"
                    );
                    assert_eq!(ran.output("members").unwrap(), "3");
                }
                Some(want) => {
                    let e = ran.error();
                    assert_eq!(e.code, "etcd-unhealthy", "{down:?}: {}", e.message);
                    assert!(e.message.starts_with(want), "{down:?}: {}", e.message);
                    assert!(e.message.ends_with(
                        "fix etcd, then retry the task (or skip this step to upgrade anyway)"
                    ));
                }
            }
        }
    }
}

#[test]
fn a_snapshot_is_saved_by_etcdctl_verified_hashed_and_pruned_to_keep() {
    let (_dir, root, _etcd) = root(&[]);
    let dir = root.join("var/lib/etcd-snapshots");
    let node = Node::new(&root, &["control-plane"]);
    let etcd = node.load(&plugins().etcd, "etcd");
    let grants = example_grants("etcd.yaml");

    // Without the directory preflight says what to create, and nothing runs.
    let refused = node.run(&etcd, &grants, "snapshot", &json!({"keep": 2}), false);
    let failed = refused.failed_checks();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].0, "snapshot-dir");
    assert!(
        failed[0]
            .1
            .contains("install -d -m 0700 /var/lib/etcd-snapshots"),
        "{failed:?}"
    );

    std::fs::create_dir_all(&dir).unwrap();
    // Two older snapshots, a leftover of an interrupted save, and a file that is not ours.
    for name in [
        "etcd-20250101T000000Z-old.db",
        "etcd-20250102T000000Z-older-but-later.db",
        "etcd-20250103T000000Z.db.part",
        "kubeadm-backup.db",
    ] {
        std::fs::write(dir.join(name), "x").unwrap();
    }
    // A snapshot with `keep: 2` and `label`, dry or not.
    let snapshot = |label: &str, dry_run: bool| {
        node.run(
            &etcd,
            &grants,
            "snapshot",
            &json!({"keep": 2, "label": label}),
            dry_run,
        )
    };
    let dry = snapshot("upgrade-a", true);
    let o = dry.outcome();
    assert!(!o.changed);
    assert!(
        o.message
            .starts_with("would save an etcd snapshot to /var/lib/etcd-snapshots/etcd-")
            && o.message.contains(
                "(would remove etcd-20250101T000000Z-old.db, etcd-20250103T000000Z.db.part)"
            ),
        "{}",
        o.message
    );
    assert_eq!(snapshots(&root).len(), 4, "a dry run writes nothing");

    let ran = snapshot("upgrade-a", false);
    let o = ran.outcome();
    assert!(o.changed, "{}", o.message);
    let path = ran.output("path").unwrap();
    let name = path.strip_prefix("/var/lib/etcd-snapshots/").unwrap();
    assert!(
        name.starts_with("etcd-") && name.ends_with("-upgrade-a.db"),
        "{path}"
    );
    let content = std::fs::read(dir.join(name)).unwrap();
    assert_eq!(content, b"simulated etcd snapshot\n");
    let sha: String = Sha256::digest(&content)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(ran.output("sha256").unwrap(), sha);
    assert_eq!(ran.output("sizeBytes").unwrap(), content.len().to_string());
    assert_eq!(ran.output("revision").unwrap(), "42");
    assert_eq!(ran.output("totalKeys").unwrap(), "7");
    assert_eq!(ran.output("etcdHash").unwrap(), "eda2e421");
    // The newest two of ours are kept; the other file is left alone.
    assert_eq!(
        snapshots(&root),
        [
            "etcd-20250102T000000Z-older-but-later.db".to_string(),
            name.to_string(),
            "kubeadm-backup.db".to_string()
        ]
    );
    assert_eq!(
        ran.output("kept").unwrap(),
        format!("etcd-20250102T000000Z-older-but-later.db,{name}")
    );
    assert!(
        o.message
            .contains("removed etcd-20250101T000000Z-old.db, etcd-20250103T000000Z.db.part"),
        "{}",
        o.message
    );

    // The same label again (the agent re-runs an interrupted step): the snapshot taken is
    // verified again and reported, nothing is saved or removed.
    let before = snapshots(&root);
    let dry = snapshot("upgrade-a", true);
    assert!(!dry.outcome().changed);
    assert_eq!(
        dry.outcome().message,
        format!(
            "would keep the etcd snapshot {path} this label already has once etcdutl verifies it again, and save none"
        )
    );
    let again = snapshot("upgrade-a", false);
    let o = again.outcome();
    assert!(!o.changed, "{}", o.message);
    assert!(
        o.message.starts_with(&format!(
            "etcd snapshot {path} was already taken with label `upgrade-a`: "
        )) && o.message.ends_with("nothing saved or removed"),
        "{}",
        o.message
    );
    for key in [
        "path",
        "sha256",
        "sizeBytes",
        "revision",
        "totalKeys",
        "etcdHash",
        "kept",
    ] {
        assert_eq!(again.output(key), ran.output(key), "{key}");
    }
    assert_eq!(snapshots(&root), before);

    // Another label (another Operation) takes its own, and the keep count prunes.
    let other = snapshot("upgrade-b", false);
    assert!(other.outcome().changed, "{}", other.outcome().message);
    let other_path = other.output("path").unwrap();
    assert!(other_path.ends_with("-upgrade-b.db"), "{other_path}");
    assert_eq!(
        snapshots(&root),
        [
            name.to_string(),
            other_path
                .strip_prefix("/var/lib/etcd-snapshots/")
                .unwrap()
                .to_string(),
            "kubeadm-backup.db".to_string()
        ]
    );
}

#[test]
fn the_snapshot_fails_before_anything_else_when_etcdutl_cannot_verify_it() {
    let (_dir, root, _etcd) = root(&[]);
    std::fs::create_dir_all(root.join("var/lib/etcd-snapshots")).unwrap();
    // An etcdctl that "saves" an empty file: etcdutl finds no snapshot there.
    let etcdctl = root.join("usr/local/bin/etcdctl");
    let script = std::fs::read_to_string(&etcdctl).unwrap().replace(
        "printf 'simulated etcd snapshot\\n' >\"$3.part\" && mv \"$3.part\" \"$3\"",
        ": >\"$3\"",
    );
    assert!(script.contains(": >\"$3\""), "the replacement took");
    std::fs::write(&etcdctl, script).unwrap();
    let node = Node::new(&root, &["control-plane"]);
    let etcd = node.load(&plugins().etcd, "etcd");
    let ran = node.run(
        &etcd,
        &example_grants("etcd.yaml"),
        "snapshot",
        &json!({"keep": 3}),
        false,
    );
    let e = ran.error();
    assert_eq!(e.code, "snapshot-unverified", "{}", e.message);
    assert!(e.message.contains("no snapshot at"), "{}", e.message);
}

#[test]
fn a_node_without_kubeadms_etcd_is_refused_in_preflight_saying_how_to_turn_the_steps_off() {
    let (_dir, root, _etcd) = root(&[]);
    std::fs::remove_file(root.join("etc/kubernetes/manifests/etcd.yaml")).unwrap();
    std::fs::create_dir_all(root.join("var/lib/etcd-snapshots")).unwrap();
    let node = Node::new(&root, &["control-plane"]);
    let etcd = node.load(&plugins().etcd, "etcd");
    for (action, params) in [
        ("health", json!({"expectedMembers": 3})),
        ("snapshot", json!({"keep": 3})),
    ] {
        let ran = node.run(&etcd, &example_grants("etcd.yaml"), action, &params, false);
        let failed = ran.failed_checks();
        assert_eq!(failed.len(), 1, "{action}: {failed:?}");
        assert_eq!(failed[0].0, "local-member");
        assert!(
            failed[0].1.contains("kubeadm runs no etcd on this node")
                && failed[0].1.contains("spec.upgrade.etcd"),
            "{action}: {failed:?}"
        );
    }
}
