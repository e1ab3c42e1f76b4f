use super::*;

// etcdctl 3.6.5's JSON, as printed against a three-member kubeadm etcd (IDs shortened).
const MEMBERS: &str = r#"{"header":{"cluster_id":1,"member_id":11,"raft_term":2},"members":[
 {"ID":11,"name":"cp1","peerURLs":["https://10.0.0.1:2380"],"clientURLs":["https://10.0.0.1:2379"]},
 {"ID":12,"name":"cp2","peerURLs":["https://10.0.0.2:2380"],"clientURLs":["https://10.0.0.2:2379"]},
 {"ID":13,"name":"cp3","peerURLs":["https://10.0.0.3:2380"],"clientURLs":["https://10.0.0.3:2379"]}]}"#;

fn health(bad: &[(&str, &str)]) -> String {
    let entries: Vec<String> = (1..=3)
        .map(|i| {
            let url = format!("https://10.0.0.{i}:2379");
            match bad.iter().find(|(u, _)| *u == url) {
                Some((_, e)) => {
                    format!(r#"{{"endpoint":"{url}","health":false,"took":"3s","error":"{e}"}}"#)
                }
                None => format!(r#"{{"endpoint":"{url}","health":true,"took":"2ms"}}"#),
            }
        })
        .collect();
    format!("[{}]", entries.join(","))
}

fn status(leaders: &[(u64, u64)]) -> String {
    let entries: Vec<String> = leaders
        .iter()
        .map(|(id, leader)| {
            format!(
                r#"{{"Endpoint":"https://10.0.0.{}:2379","Status":{{"header":{{"cluster_id":1,"member_id":{id},"revision":9,"raft_term":2}},"version":"3.5.24","dbSize":20480,"leader":{leader},"raftIndex":6,"raftTerm":2}}}}"#,
                id - 10
            )
        })
        .collect();
    format!("[{}]", entries.join(","))
}

fn observed(members: &str, alarms: &str, health: &str, status: &str) -> Observed {
    Observed {
        members: serde_json::from_str::<MemberList>(members).unwrap().members,
        alarms: serde_json::from_str::<AlarmList>(alarms).unwrap().alarms,
        health: serde_json::from_str(health).unwrap(),
        status: serde_json::from_str(status).unwrap(),
        status_failures: Vec::new(),
    }
}

const NO_ALARM: &str = r#"{"header":{"cluster_id":1,"member_id":11,"revision":9,"raft_term":2}}"#;

#[test]
fn the_health_verdict_names_the_member_and_the_fault() {
    let all_follow_11 = status(&[(11, 11), (12, 11), (13, 11)]);
    let cases: Vec<(&str, Observed, Option<u32>, Vec<&str>)> = vec![
        (
            "healthy",
            observed(MEMBERS, NO_ALARM, &health(&[]), &all_follow_11),
            Some(3),
            vec![],
        ),
        (
            "one member down",
            observed(
                MEMBERS,
                NO_ALARM,
                &health(&[("https://10.0.0.2:2379", "context deadline exceeded")]),
                &status(&[(11, 11), (13, 11)]),
            ),
            Some(3),
            vec!["member cp2 (https://10.0.0.2:2379) is not healthy: context deadline exceeded"],
        ),
        (
            "fewer members than control planes",
            observed(MEMBERS, NO_ALARM, &health(&[]), &all_follow_11),
            Some(4),
            vec![
                "etcd has 3 members (cp1 (https://10.0.0.1:2379), cp2 (https://10.0.0.2:2379), cp3 (https://10.0.0.3:2379)) and the cluster 4 control-plane Nodes",
            ],
        ),
        (
            "an alarm",
            observed(
                MEMBERS,
                r#"{"header":{},"alarms":[{"memberID":13,"alarm":1}]}"#,
                &health(&[]),
                &all_follow_11,
            ),
            Some(3),
            vec!["member cp3 (https://10.0.0.3:2379) has alarm NOSPACE"],
        ),
        (
            "corrupt",
            observed(
                MEMBERS,
                r#"{"header":{},"alarms":[{"memberID":12,"alarm":2}]}"#,
                &health(&[]),
                &all_follow_11,
            ),
            None,
            vec!["member cp2 (https://10.0.0.2:2379) has alarm CORRUPT"],
        ),
        (
            "no leader",
            observed(
                MEMBERS,
                NO_ALARM,
                &health(&[]),
                &status(&[(11, 0), (12, 0), (13, 0)]),
            ),
            Some(3),
            vec!["etcd has no leader"],
        ),
        (
            "split views of the leader",
            observed(
                MEMBERS,
                NO_ALARM,
                &health(&[]),
                &status(&[(11, 11), (12, 12), (13, 11)]),
            ),
            Some(3),
            vec![
                "the members disagree on the leader (2 different: cp1 (https://10.0.0.1:2379) follows b, cp2 (https://10.0.0.2:2379) follows c",
            ],
        ),
        (
            "a member never started",
            observed(
                r#"{"members":[{"ID":11,"name":"cp1","clientURLs":["https://10.0.0.1:2379"]},{"ID":255,"peerURLs":["https://10.0.0.9:2380"]}]}"#,
                NO_ALARM,
                r#"[{"endpoint":"https://10.0.0.1:2379","health":true}]"#,
                &status(&[(11, 11)]),
            ),
            Some(2),
            vec!["member ff (never started) was added but never started"],
        ),
    ];
    for (name, seen, expected, want) in cases {
        let v = judge(&seen, expected);
        assert_eq!(v.faults.len(), want.len(), "{name}: {:?}", v.faults);
        for (got, want) in v.faults.iter().zip(&want) {
            assert!(
                got.starts_with(want),
                "{name}: {got:?} should start with {want:?}"
            );
        }
        assert_eq!(
            v.leader.is_some(),
            !name.contains("leader"),
            "{name}: leader {:?}",
            v.leader
        );
    }
}

#[test]
fn a_healthy_cluster_reports_its_leader() {
    let seen = observed(
        MEMBERS,
        NO_ALARM,
        &health(&[]),
        &status(&[(11, 12), (12, 12), (13, 12)]),
    );
    assert_eq!(
        judge(&seen, Some(3)),
        Verdict {
            faults: vec![],
            leader: Some("cp2 (https://10.0.0.2:2379)".into())
        }
    );
}

#[test]
fn snapshots_are_named_by_time_and_pruned_oldest_first_and_only_ours() {
    assert_eq!(timestamp(0), "19700101T000000Z");
    assert_eq!(timestamp(1_780_000_000), "20260528T202640Z");
    assert_eq!(timestamp(951_782_400), "20000229T000000Z");
    assert_eq!(
        file_name(1_780_000_000, Some("upgrade-v1-34-4")),
        "etcd-20260528T202640Z-upgrade-v1-34-4.db"
    );
    let names: Vec<String> = [
        "etcd-20260101T000000Z-a.db",
        "etcd-20260301T000000Z-c.db",
        "etcd-20260201T000000Z-b.db",
        "etcd-20260401T000000Z-d.db.part",
        "kubeadm-backup.db",
        "notes.txt",
        "etcd-20250101T000000Z.db",
    ]
    .iter()
    .map(|s| (*s).to_string())
    .collect();
    let cases: [(usize, &[&str]); 4] = [
        (
            1,
            &[
                "etcd-20250101T000000Z.db",
                "etcd-20260101T000000Z-a.db",
                "etcd-20260201T000000Z-b.db",
                "etcd-20260401T000000Z-d.db.part",
            ],
        ),
        (
            3,
            &[
                "etcd-20250101T000000Z.db",
                "etcd-20260401T000000Z-d.db.part",
            ],
        ),
        (4, &["etcd-20260401T000000Z-d.db.part"]),
        (100, &["etcd-20260401T000000Z-d.db.part"]),
    ];
    for (keep, want) in cases {
        assert_eq!(to_remove(&names, keep), want, "keep {keep}");
    }
}

#[test]
fn a_snapshot_is_verified_from_etcdutls_status() {
    // etcdutl 3.6.5's output for a snapshot of a running cluster, and an empty database.
    let good: SnapshotStatus = serde_json::from_str(
        r#"{"hash":3986875425,"revision":2,"totalKey":1,"totalSize":20480,"version":"3.6.0"}"#,
    )
    .unwrap();
    assert_eq!(verified(&good), Ok(()));
    let empty: SnapshotStatus = serde_json::from_str(
        r#"{"hash":0,"revision":0,"totalKey":0,"totalSize":20480,"version":""}"#,
    )
    .unwrap();
    assert!(
        verified(&empty)
            .unwrap_err()
            .contains("revision 0 and 0 keys")
    );
}

#[test]
fn params_are_checked_and_the_planners_deserialize() {
    let a: Action = serde_json::from_value(serde_json::json!(
        {"action": "snapshot", "params": {"keep": 3, "label": "upgrade-v1-34-4"}}
    ))
    .unwrap();
    let Action::Snapshot(p) = a else { panic!() };
    assert_eq!(label_ok(&p), Ok(()));
    let a: Action = serde_json::from_value(serde_json::json!(
        {"action": "health", "params": {"expectedMembers": 3}}
    ))
    .unwrap();
    assert!(matches!(
        a,
        Action::Health(HealthParams {
            expected_members: Some(3),
            wait_seconds: 30
        })
    ));
    for (keep, label, ok) in [
        (3, Some("a/b"), false),
        (3, Some("../x"), false),
        (3, Some(".hidden"), false),
        (3, Some("UPPER"), false),
        (0, None, false),
        (101, None, false),
        (100, Some("ok.name-1"), true),
    ] {
        let p = SnapshotParams {
            keep,
            label: label.map(str::to_owned),
        };
        assert_eq!(label_ok(&p).is_ok(), ok, "keep {keep} label {label:?}");
    }
}

#[test]
fn metadata_requests_exactly_the_commands_and_the_snapshot_directory() {
    let m = Etcd::metadata();
    assert_eq!(m.name, "etcd");
    assert_eq!(
        m.actions
            .iter()
            .map(|a| a.name.as_str())
            .collect::<Vec<_>>(),
        ["health", "snapshot"]
    );
    assert!(m.actions.iter().all(|a| a.idempotent));
    assert_eq!(m.capabilities.filesystem.len(), 2);
    assert_eq!(m.capabilities.filesystem[0].path, SNAPSHOT_DIR);
    assert!(m.capabilities.filesystem[0].writable);
    assert_eq!(
        m.capabilities.filesystem[1].path,
        "/etc/kubernetes/manifests"
    );
    assert!(!m.capabilities.filesystem[1].writable);
    assert_eq!(m.capabilities.exec.len(), 6);
    assert!(m.capabilities.services.is_empty() && m.capabilities.http.is_empty());
}

#[test]
fn the_local_member_is_read_from_kubeadms_annotation() {
    let manifest = |value: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  annotations:\n    kubeadm.kubernetes.io/etcd.advertise-client-urls: {value}\n  name: etcd\n"
        )
    };
    let cases: [(&str, Result<&str, &str>); 7] = [
        (
            "https://10.231.0.11:2379",
            Ok("--endpoints=https://10.231.0.11:2379"),
        ),
        (
            "\"https://[fd00::11]:2379\"",
            Ok("--endpoints=https://[fd00::11]:2379"),
        ),
        (
            "http://10.0.0.1:2379,https://cp1.example:2379",
            Ok("--endpoints=https://cp1.example:2379"),
        ),
        ("http://10.0.0.1:2379", Err("no https URL")),
        (
            "https://10.0.0.1:4001",
            Err("expected https://ADDRESS:2379"),
        ),
        (
            "https://evil/path:2379",
            Err("expected https://ADDRESS:2379"),
        ),
        (
            "https://user@host:2379",
            Err("expected https://ADDRESS:2379"),
        ),
    ];
    for (value, want) in cases {
        let got = local_endpoint(&manifest(value));
        match want {
            Ok(w) => assert_eq!(got.as_deref(), Ok(w), "{value}"),
            Err(w) => assert!(
                got.as_ref().is_err_and(|e| e.contains(w)),
                "{value}: {got:?}"
            ),
        }
    }
    assert!(
        local_endpoint("kind: Pod\n")
            .unwrap_err()
            .contains("has no kubeadm.kubernetes.io/etcd.advertise-client-urls annotation")
    );
}

#[test]
fn a_labelled_snapshot_is_found_by_its_whole_label_only() {
    let names: Vec<String> = [
        "etcd-20250101T000000Z-up-a1b2c3d4.db",
        "etcd-20250102T000000Z-up-a1b2c3d4.db",
        "etcd-20250103T000000Z-other-up-a1b2c3d4.db",
        "etcd-20250104T000000Z-up-a1b2c3d4.db.part",
        "etcd-2025010XT000000Z-up-a1b2c3d4.db",
        "etcd-20250105T000000Z.db",
        "kubeadm-backup-up-a1b2c3d4.db",
    ]
    .map(String::from)
    .to_vec();
    assert_eq!(
        labelled(&names, "up-a1b2c3d4").map(String::as_str),
        Some("etcd-20250102T000000Z-up-a1b2c3d4.db"),
        "the newest whole match; not a longer label ending in it, a .part, a malformed time or another file"
    );
    assert_eq!(
        labelled(&names, "other-up-a1b2c3d4").map(String::as_str),
        Some("etcd-20250103T000000Z-other-up-a1b2c3d4.db")
    );
    assert_eq!(labelled(&names, "a1b2c3d4"), None);
    assert_eq!(labelled(&names, "up"), None);
    assert_eq!(labelled(&names, ""), None);
    // Every name the plugin makes is found by its label.
    let made = file_name(1_767_225_600, Some("op.1-x"));
    assert_eq!(labelled(std::slice::from_ref(&made), "op.1-x"), Some(&made));
}
