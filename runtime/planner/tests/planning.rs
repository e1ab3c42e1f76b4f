//! The planner and scheduler over realistic clusters, and a simulated rollout run to the end
//! for many cluster sizes and rollout limits.

use std::collections::{BTreeMap, BTreeSet};

use bosun_api::node_task::{NodeTaskPhase, Recovery};
use bosun_api::operation::{
    CustomGroup, CustomSpec, ExecutionMode, KubePackage, OperationPhase, OperationSpec, Plan,
    RebootSpec, RenewCertificatesSpec, Rollout, RunsOn, Step, UpgradeSpec, match_labels,
};
use bosun_planner::nodes::NodeInfo;
use bosun_planner::plan::groups;
use bosun_planner::state::{TaskEvent, task_transition};
use bosun_planner::{
    OperationIdentity, PlanError, TaskView, plan, plan_identified, schedule, snapshot_label,
    task_name,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

fn upgrade_spec(max_unavailable: IntOrString) -> OperationSpec {
    OperationSpec {
        upgrade: Some(UpgradeSpec {
            kubernetes_version: "v1.34.2".into(),
            packages: vec![
                KubePackage::Kubeadm,
                KubePackage::Kubelet,
                KubePackage::Kubectl,
            ],
            etcd: Default::default(),
        }),
        rollout: Rollout { max_unavailable },
        ..Default::default()
    }
}

fn cluster(cp: usize, workers: usize) -> Vec<NodeInfo> {
    let mut nodes: Vec<NodeInfo> = (0..cp)
        .map(|i| NodeInfo::control_plane(&format!("cp-{i}")))
        .collect();
    nodes.extend((0..workers).map(|i| NodeInfo::worker(&format!("w-{i:03}"))));
    nodes
}

fn step_names(steps: &[Step]) -> Vec<&str> {
    steps.iter().map(|s| s.name.as_str()).collect()
}

fn not_control_plane() -> LabelSelector {
    LabelSelector {
        match_labels: None,
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: "node-role.kubernetes.io/control-plane".into(),
            operator: "DoesNotExist".into(),
            values: None,
        }]),
    }
}

#[test]
fn upgrade_plans_first_control_plane_then_the_others_then_workers() {
    let out = plan(
        "up",
        &upgrade_spec(IntOrString::String("50%".into())),
        &cluster(3, 5),
        None,
    )
    .unwrap();
    let g = &out.plan.groups;
    assert_eq!(g.len(), 3);
    assert_eq!(
        (g[0].name.as_str(), g[0].nodes.clone(), g[0].max_parallel),
        (groups::CONTROL_PLANE_FIRST, vec!["cp-0".to_string()], 1)
    );
    assert_eq!(
        (g[1].name.as_str(), g[1].nodes.clone(), g[1].max_parallel),
        (
            groups::CONTROL_PLANE,
            vec!["cp-1".to_string(), "cp-2".to_string()],
            1
        )
    );
    assert_eq!(g[1].control_plane_nodes, g[1].nodes);
    assert_eq!(g[2].name, groups::WORKERS);
    assert_eq!(
        g[2].nodes,
        vec!["w-000", "w-001", "w-002", "w-003", "w-004"]
    );
    assert_eq!(g[2].max_parallel, 2, "50% of 5 rounds down to 2");
    assert!(g[2].control_plane_nodes.is_empty());

    assert_eq!(out.tasks.len(), 8);
    let first = &out.tasks[0];
    assert_eq!(first.name, "up-cp-0");
    assert_eq!(first.labels["bosun.dev/node"], "cp-0");
    assert_eq!(first.labels["bosun.dev/operation"], "up");
    assert_eq!(
        step_names(&first.spec.steps),
        [
            "etcd-health",
            "etcd-snapshot",
            "cordon",
            "drain",
            "upgrade-kubeadm",
            "kubeadm-upgrade",
            "upgrade-kubelet",
            "restart-kubelet",
            "wait-node-ready",
            "uncordon",
            "wait-api-server"
        ]
    );
    // The etcd safety net, before the node is cordoned: the health check expects one member
    // per control-plane Node of the cluster, the snapshot is named after the Operation.
    let (health, snapshot) = (&first.spec.steps[0], &first.spec.steps[1]);
    assert_eq!(
        (
            health.plugin.as_deref(),
            health.action.as_str(),
            health.runs_on
        ),
        (Some("etcd"), "health", RunsOn::Agent)
    );
    assert_eq!(
        health.params,
        Some(serde_json::json!({"expectedMembers": 3}))
    );
    assert_eq!(
        (snapshot.plugin.as_deref(), snapshot.action.as_str()),
        (Some("etcd"), "snapshot")
    );
    assert_eq!(
        snapshot.params,
        Some(serde_json::json!({"keep": 3, "label": "up"}))
    );
    let kubeadm = &first.spec.steps[5];
    assert_eq!(
        (kubeadm.plugin.as_deref(), kubeadm.action.as_str()),
        (Some("kubeadm-upgrade"), "apply")
    );
    assert_eq!(
        kubeadm.params.as_ref().unwrap()["kubernetesVersion"],
        "v1.34.2"
    );
    assert_eq!(first.spec.steps[2].runs_on, RunsOn::Controller);
    assert_eq!(
        first.spec.steps[4].params.as_ref().unwrap()["packages"],
        serde_json::json!(["kubeadm"])
    );
    assert_eq!(
        first.spec.steps[6].params.as_ref().unwrap()["packages"],
        serde_json::json!(["kubelet", "kubectl"])
    );

    // The other control planes check etcd's health and take no snapshot.
    let second_cp = &out.tasks[1];
    assert_eq!(
        &step_names(&second_cp.spec.steps)[..3],
        ["etcd-health", "cordon", "drain"]
    );
    assert_eq!(second_cp.spec.steps[4].action, "node");
    assert_eq!(second_cp.spec.steps.last().unwrap().name, "wait-api-server");

    let worker = &out.tasks[3];
    assert_eq!(worker.spec.group, "workers");
    assert_eq!(
        step_names(&worker.spec.steps),
        [
            "cordon",
            "drain",
            "upgrade-kubeadm",
            "kubeadm-upgrade",
            "upgrade-kubelet",
            "restart-kubelet",
            "wait-node-ready",
            "uncordon"
        ]
    );
    assert_eq!(worker.spec.steps[3].action, "node");
    for task in &out.tasks {
        for step in &task.spec.steps {
            match step.runs_on {
                RunsOn::Agent => assert!(
                    ["kubeadm-upgrade", "packages", "kubelet", "etcd"]
                        .contains(&step.plugin.as_deref().unwrap())
                ),
                RunsOn::Controller => assert!(step.plugin.is_none()),
            }
        }
    }
}

#[test]
fn upgrade_without_package_management_only_runs_kubeadm_and_restarts() {
    let mut spec = upgrade_spec(IntOrString::Int(1));
    spec.upgrade.as_mut().unwrap().packages.clear();
    let out = plan("up", &spec, &cluster(1, 1), None).unwrap();
    assert_eq!(
        step_names(&out.tasks[1].spec.steps),
        [
            "cordon",
            "drain",
            "kubeadm-upgrade",
            "restart-kubelet",
            "wait-node-ready",
            "uncordon"
        ]
    );
}

#[test]
fn first_control_plane_node_is_a_ready_one() {
    let mut nodes = cluster(3, 0);
    nodes[0].ready = false;
    let out = plan("up", &upgrade_spec(IntOrString::Int(1)), &nodes, None).unwrap();
    assert_eq!(out.plan.groups[0].nodes, vec!["cp-1"]);
    assert_eq!(out.plan.groups[1].nodes, vec!["cp-0", "cp-2"]);
    assert!(
        out.notes.iter().any(|n| n.contains("cp-0 is NotReady")),
        "{:?}",
        out.notes
    );

    for n in &mut nodes {
        n.ready = false;
    }
    let err = plan("up", &upgrade_spec(IntOrString::Int(1)), &nodes, None).unwrap_err();
    assert!(matches!(err, PlanError::NoReadyControlPlane { .. }));
    assert!(err.to_string().contains("none is Ready"), "{err}");
}

#[test]
fn a_node_cordoned_before_the_operation_stays_cordoned() {
    let mut nodes = cluster(1, 2);
    nodes[2].unschedulable = true;
    let out = plan("up", &upgrade_spec(IntOrString::Int(1)), &nodes, None).unwrap();
    let names = |i: usize| step_names(&out.tasks[i].spec.steps).contains(&"uncordon");
    assert!(names(1));
    assert!(
        !names(2),
        "w-001 was cordoned by someone else: it must not be uncordoned"
    );
    assert!(
        out.notes
            .iter()
            .any(|n| n.contains("w-001 was already cordoned"))
    );
}

#[test]
fn a_cordon_bosun_left_behind_is_undone_by_the_next_operation() {
    // An earlier Operation deleted while it drained w-001: its cordon, recorded as
    // Bosun's, is still there.
    let mut nodes = cluster(1, 2);
    nodes[2].unschedulable = true;
    nodes[2].cordoned_by = Some("old-up-w-001".into());
    // Schedulable again (a person uncordoned it): nothing to undo, nothing to say.
    nodes[1].cordoned_by = None;
    let out = plan("up", &upgrade_spec(IntOrString::Int(1)), &nodes, None).unwrap();
    let uncordons = |i: usize| step_names(&out.tasks[i].spec.steps).contains(&"uncordon");
    assert!(uncordons(1));
    assert!(uncordons(2), "Bosun's own leftover cordon is undone");
    assert!(
        out.notes
            .iter()
            .any(|n| n.contains("node w-001 is still cordoned by Bosun (NodeTask old-up-w-001")),
        "{:?}",
        out.notes
    );
    assert!(
        !out.notes
            .iter()
            .any(|n| n.contains("w-001 was already cordoned")),
        "{:?}",
        out.notes
    );
}

#[test]
fn node_order_does_not_depend_on_snapshot_order() {
    let mut nodes = cluster(3, 7);
    let a = plan(
        "up",
        &upgrade_spec(IntOrString::String("30%".into())),
        &nodes,
        None,
    )
    .unwrap();
    nodes.reverse();
    let b = plan(
        "up",
        &upgrade_spec(IntOrString::String("30%".into())),
        &nodes,
        None,
    )
    .unwrap();
    assert_eq!(a, b);
}

#[test]
fn upgrade_needs_a_control_plane_unless_the_selector_chose_workers_only() {
    let err = plan(
        "up",
        &upgrade_spec(IntOrString::Int(1)),
        &cluster(0, 3),
        None,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            PlanError::NoControlPlane {
                kind: "upgrade",
                selected: 3
            }
        ),
        "{err:?}"
    );

    let mut spec = upgrade_spec(IntOrString::Int(1));
    spec.node_selector = Some(not_control_plane());
    let out = plan("up", &spec, &cluster(1, 3), None).unwrap();
    assert_eq!(out.plan.groups.len(), 1);
    assert_eq!(out.plan.groups[0].name, "workers");
    assert!(
        out.tasks
            .iter()
            .all(|t| t.spec.steps.iter().all(|s| s.action != "apply"))
    );
    assert!(
        out.notes
            .iter()
            .any(|n| n.contains("only workers are upgraded"))
    );
}

#[test]
fn global_node_selector_limits_every_group() {
    let mut nodes = cluster(1, 4);
    nodes[1].labels.insert("pool".into(), "blue".into());
    nodes[2].labels.insert("pool".into(), "blue".into());
    nodes[0].labels.insert("pool".into(), "blue".into());
    let mut spec = upgrade_spec(IntOrString::Int(5));
    spec.node_selector = Some(match_labels([("pool", "blue")]));
    let out = plan("up", &spec, &nodes, None).unwrap();
    assert_eq!(
        out.plan.node_names().collect::<Vec<_>>(),
        ["cp-0", "w-000", "w-001"]
    );
    assert_eq!(
        out.plan.groups[1].max_parallel, 2,
        "an integer above the group size is capped at the group size"
    );

    spec.node_selector = Some(match_labels([("pool", "green")]));
    let err = plan("up", &spec, &nodes, None).unwrap_err();
    assert!(
        matches!(
            err,
            PlanError::NoControlPlane { .. } | PlanError::NoMatchingNodes { .. }
        ),
        "{err:?}"
    );
}

#[test]
fn renew_certificates_runs_on_control_plane_nodes_one_at_a_time() {
    let spec = OperationSpec {
        renew_certificates: Some(RenewCertificatesSpec {
            certificates: vec![bosun_api::operation::CertificateName::All],
            renew_before: Some("720h".into()),
        }),
        rollout: Rollout {
            max_unavailable: IntOrString::String("100%".into()),
        },
        ..Default::default()
    };
    let out = plan("certs", &spec, &cluster(3, 10), None).unwrap();
    assert_eq!(out.plan.groups.len(), 1);
    let g = &out.plan.groups[0];
    assert_eq!((g.name.as_str(), g.max_parallel), ("control-plane", 1));
    assert_eq!(g.nodes, vec!["cp-0", "cp-1", "cp-2"]);
    let steps = &out.tasks[0].spec.steps;
    assert_eq!(
        step_names(steps),
        [
            "renew-certificates",
            "restart-control-plane",
            "wait-api-server"
        ]
    );
    assert_eq!(steps[0].plugin.as_deref(), Some("certs"));
    assert_eq!(
        steps[0].params.as_ref().unwrap(),
        &serde_json::json!({"certificates": ["all"], "renewBefore": "720h"})
    );

    let err = plan("certs", &spec, &cluster(0, 2), None).unwrap_err();
    assert!(
        err.to_string()
            .contains("renewCertificates needs control-plane nodes"),
        "{err}"
    );
}

fn custom_step(name: &str) -> Step {
    Step {
        name: name.into(),
        runs_on: RunsOn::Agent,
        plugin: Some("hello".into()),
        action: "greet".into(),
        params: None,
        await_new_boot: false,
    }
}

fn custom_spec(groups: Vec<CustomGroup>, max_unavailable: IntOrString) -> OperationSpec {
    OperationSpec {
        custom: Some(CustomSpec { groups }),
        rollout: Rollout { max_unavailable },
        ..Default::default()
    }
}

#[test]
fn custom_groups_take_nodes_in_order_and_each_node_once() {
    let mut nodes = cluster(1, 4);
    nodes[1].labels.insert("zone".into(), "a".into());
    nodes[2].labels.insert("zone".into(), "a".into());
    let groups = vec![
        CustomGroup {
            name: "zone-a".into(),
            node_selector: Some(match_labels([("zone", "a")])),
            steps: vec![custom_step("one")],
        },
        CustomGroup {
            name: "rest".into(),
            node_selector: None,
            steps: vec![custom_step("two"), custom_step("three")],
        },
        CustomGroup {
            name: "never".into(),
            node_selector: Some(match_labels([("zone", "z")])),
            steps: vec![custom_step("x")],
        },
    ];
    let mut spec = custom_spec(groups, IntOrString::Int(2));
    spec.execution_mode = ExecutionMode::DryRun;
    spec.step_timeout_seconds = Some(60);
    let out = plan("c", &spec, &nodes, None).unwrap();
    let g = &out.plan.groups;
    assert_eq!(g[0].nodes, vec!["w-000", "w-001"]);
    assert_eq!(
        g[1].nodes,
        vec!["cp-0", "w-002", "w-003"],
        "control-plane first, then by name; nodes of zone-a are not repeated"
    );
    assert_eq!(g[1].control_plane_nodes, vec!["cp-0"]);
    assert_eq!(g[1].max_parallel, 2);
    assert!(g[2].nodes.is_empty());
    assert!(
        out.notes
            .iter()
            .any(|n| n.contains("group never matches no node"))
    );
    assert_eq!(step_names(&out.tasks[2].spec.steps), ["two", "three"]);
    assert!(
        out.tasks
            .iter()
            .all(|t| t.spec.dry_run && t.spec.step_timeout_seconds == Some(60) && !t.spec.approve)
    );
}

#[test]
fn a_frozen_plan_is_kept_even_when_nodes_come_and_go() {
    let spec = upgrade_spec(IntOrString::Int(2));
    let first = plan("up", &spec, &cluster(1, 3), None).unwrap();
    // Two nodes join, one leaves.
    let mut later = cluster(1, 5);
    later.retain(|n| n.name != "w-001");
    let again = plan("up", &spec, &later, Some(&first.plan)).unwrap();
    assert_eq!(again.plan, first.plan);
    assert_eq!(again.tasks.len(), first.tasks.len());
    assert!(
        again
            .tasks
            .iter()
            .all(|t| !t.spec.node_name.starts_with("w-003")
                && !t.spec.node_name.starts_with("w-004"))
    );
    assert_eq!(
        again.tasks, first.tasks,
        "task specs are rebuilt identically for the frozen plan"
    );

    // A frozen plan that does not belong to this spec is reported, not guessed at.
    let custom = custom_spec(
        vec![CustomGroup {
            name: "g".into(),
            node_selector: None,
            steps: vec![custom_step("s")],
        }],
        IntOrString::Int(1),
    );
    let err = plan("up", &custom, &later, Some(&first.plan)).unwrap_err();
    assert!(
        matches!(err, PlanError::FrozenGroupUnknown { .. }),
        "{err:?}"
    );
}

fn reboot_spec(max_unavailable: IntOrString, selector: Option<LabelSelector>) -> OperationSpec {
    reboot_named(max_unavailable, selector, &[])
}

fn reboot_named(
    max_unavailable: IntOrString,
    selector: Option<LabelSelector>,
    nodes: &[&str],
) -> OperationSpec {
    OperationSpec {
        reboot: Some(RebootSpec {
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        }),
        node_selector: selector,
        rollout: Rollout { max_unavailable },
        ..Default::default()
    }
}

#[test]
fn reboot_drains_and_reboots_control_planes_one_at_a_time_then_workers() {
    let steps_of_worker = ["cordon", "drain", "reboot", "wait-node-ready", "uncordon"];
    let steps_of_control_plane = [
        "cordon",
        "drain",
        "reboot",
        "wait-node-ready",
        "uncordon",
        "wait-api-server",
    ];
    // (cluster, maxUnavailable, selector, spec.reboot.nodes, expected groups (name, nodes,
    // max parallel), the notes' mentions)
    type Case = (
        (usize, usize),
        IntOrString,
        Option<LabelSelector>,
        Vec<&'static str>,
        Vec<(&'static str, Vec<&'static str>, u32)>,
        Vec<&'static str>,
    );
    let cases: Vec<Case> = vec![
        (
            (3, 4),
            IntOrString::Int(2),
            None,
            vec![],
            vec![
                ("control-plane", vec!["cp-0", "cp-1", "cp-2"], 1),
                ("workers", vec!["w-000", "w-001", "w-002", "w-003"], 2),
            ],
            vec![],
        ),
        // Workers only: no control-plane group, and that is no error.
        (
            (1, 3),
            IntOrString::String("100%".into()),
            Some(not_control_plane()),
            vec![],
            vec![("workers", vec!["w-000", "w-001", "w-002"], 3)],
            vec![],
        ),
        // One worker, by its hostname label.
        (
            (3, 3),
            IntOrString::Int(1),
            Some(match_labels([("kubernetes.io/hostname", "w-001")])),
            vec![],
            vec![("workers", vec!["w-001"], 1)],
            vec![],
        ),
        // Control planes only: still one at a time, whatever maxUnavailable says.
        (
            (2, 0),
            IntOrString::Int(5),
            None,
            vec![],
            vec![("control-plane", vec!["cp-0", "cp-1"], 1)],
            vec![],
        ),
        // By name (what a ClusterLifecycle generates); a name the selector refuses, or no
        // node has, is a note.
        (
            (3, 3),
            IntOrString::Int(2),
            Some(not_control_plane()),
            vec!["w-002", "cp-1", "gone"],
            vec![("workers", vec!["w-002"], 1)],
            vec!["names cp-1", "names gone"],
        ),
    ];
    for ((cp, w), max, selector, named, expected, notes) in cases {
        let mut nodes = cluster(cp, w);
        for n in &mut nodes {
            n.labels
                .insert("kubernetes.io/hostname".into(), n.name.clone());
        }
        let spec = reboot_named(max.clone(), selector.clone(), &named);
        let out = plan("rb", &spec, &nodes, None).unwrap();
        let reboot_notes: Vec<&String> = out
            .notes
            .iter()
            .filter(|n| n.contains("spec.reboot.nodes"))
            .collect();
        assert_eq!(reboot_notes.len(), notes.len(), "{reboot_notes:?}");
        for (note, mention) in reboot_notes.iter().zip(&notes) {
            assert!(note.contains(mention), "{note} should mention {mention}");
        }
        let got: Vec<(&str, Vec<&str>, u32)> = out
            .plan
            .groups
            .iter()
            .map(|g| {
                (
                    g.name.as_str(),
                    g.nodes.iter().map(String::as_str).collect(),
                    g.max_parallel,
                )
            })
            .collect();
        assert_eq!(
            got, expected,
            "{cp}+{w} nodes, maxUnavailable {max:?}, {selector:?}"
        );
        for task in &out.tasks {
            let control_plane = task.spec.node_name.starts_with("cp-");
            let expected: &[&str] = if control_plane {
                &steps_of_control_plane
            } else {
                &steps_of_worker
            };
            assert_eq!(
                step_names(&task.spec.steps),
                expected,
                "{}",
                task.spec.node_name
            );
            // Only the reboot step waits for a new boot, and it is the plugin's.
            for step in &task.spec.steps {
                assert_eq!(step.await_new_boot, step.name == "reboot", "{}", step.name);
            }
            let reboot = &task.spec.steps[2];
            assert_eq!(
                (
                    reboot.runs_on,
                    reboot.plugin.as_deref(),
                    reboot.action.as_str()
                ),
                (RunsOn::Agent, Some("reboot"), "reboot")
            );
        }
    }
    // A node someone else cordoned stays cordoned after its reboot.
    let mut nodes = cluster(1, 2);
    nodes[2].unschedulable = true;
    let out = plan("rb", &reboot_spec(IntOrString::Int(1), None), &nodes, None).unwrap();
    assert!(step_names(&out.tasks[1].spec.steps).contains(&"uncordon"));
    assert!(!step_names(&out.tasks[2].spec.steps).contains(&"uncordon"));
    // Reboot and another kind together are refused.
    let mut both = reboot_spec(IntOrString::Int(1), None);
    both.renew_certificates = Some(RenewCertificatesSpec {
        certificates: vec![],
        renew_before: None,
    });
    assert_eq!(
        plan("x", &both, &cluster(1, 1), None).unwrap_err(),
        PlanError::SeveralKinds {
            kinds: vec!["renewCertificates", "reboot"]
        }
    );
}

#[test]
fn plan_errors_for_bad_specs() {
    assert_eq!(
        plan("x", &OperationSpec::default(), &cluster(1, 1), None).unwrap_err(),
        PlanError::NoKind
    );
    let mut both = upgrade_spec(IntOrString::Int(1));
    both.renew_certificates = Some(RenewCertificatesSpec {
        certificates: vec![],
        renew_before: None,
    });
    assert!(matches!(
        plan("x", &both, &cluster(1, 1), None).unwrap_err(),
        PlanError::SeveralKinds { .. }
    ));
    let bad = upgrade_spec(IntOrString::String("0%".into()));
    assert!(matches!(
        plan("x", &bad, &cluster(1, 1), None).unwrap_err(),
        PlanError::MaxUnavailable(_)
    ));
    let err = plan("x", &upgrade_spec(IntOrString::Int(1)), &[], None).unwrap_err();
    assert!(err.to_string().contains("found none"), "{err}");
}

#[test]
fn task_names_fit_object_name_limits_and_stay_distinct() {
    assert_eq!(task_name("op", "node-1"), "op-node-1");
    let long_node = format!("{}.example.com", "n".repeat(240));
    let a = task_name("upgrade", &format!("a{long_node}"));
    let b = task_name("upgrade", &format!("b{long_node}"));
    assert!(a.len() <= 253 && b.len() <= 253);
    assert_ne!(a, b);
    assert!(a.chars().last().unwrap().is_ascii_alphanumeric());
}

// ---- scheduling ----

fn views(plan: &Plan, phase: NodeTaskPhase) -> BTreeMap<String, TaskView> {
    plan.node_names()
        .map(|n| {
            (
                n.to_string(),
                TaskView {
                    phase,
                    approve: false,
                },
            )
        })
        .collect()
}

fn everyone(plan: &Plan) -> BTreeSet<String> {
    plan.node_names().map(String::from).collect()
}

#[test]
fn schedule_creates_missing_tasks_and_starts_the_first_node_only() {
    let p = plan(
        "up",
        &upgrade_spec(IntOrString::Int(3)),
        &cluster(2, 4),
        None,
    )
    .unwrap()
    .plan;
    let s = schedule(
        &p,
        &BTreeMap::new(),
        &everyone(&p),
        false,
        ExecutionMode::Auto,
    );
    assert_eq!(s.create.len(), 6);
    assert!(s.start.is_empty(), "tasks must exist before they start");
    let s = schedule(
        &p,
        &views(&p, NodeTaskPhase::Pending),
        &everyone(&p),
        false,
        ExecutionMode::Auto,
    );
    assert_eq!(s.start, vec!["cp-0"]);
    assert_eq!(s.current_group.as_deref(), Some("control-plane-first"));
    assert_eq!(s.phase, OperationPhase::Running);
    assert_eq!(s.progress, "0/6");
}

#[test]
fn schedule_respects_group_order_and_max_parallel() {
    let p = plan(
        "up",
        &upgrade_spec(IntOrString::Int(3)),
        &cluster(2, 4),
        None,
    )
    .unwrap()
    .plan;
    let mut tasks = views(&p, NodeTaskPhase::Pending);
    tasks.get_mut("cp-0").unwrap().phase = NodeTaskPhase::Succeeded;
    tasks.get_mut("cp-1").unwrap().phase = NodeTaskPhase::Running;
    let s = schedule(&p, &tasks, &everyone(&p), false, ExecutionMode::Auto);
    assert!(
        s.start.is_empty(),
        "workers wait for the control-plane group: {s:?}"
    );
    tasks.get_mut("cp-1").unwrap().phase = NodeTaskPhase::Succeeded;
    let s = schedule(&p, &tasks, &everyone(&p), false, ExecutionMode::Auto);
    assert_eq!(s.start, vec!["w-000", "w-001", "w-002"]);
    tasks.get_mut("w-000").unwrap().phase = NodeTaskPhase::Succeeded;
    tasks.get_mut("w-001").unwrap().phase = NodeTaskPhase::Running;
    tasks.get_mut("w-002").unwrap().phase = NodeTaskPhase::Running;
    let s = schedule(&p, &tasks, &everyone(&p), false, ExecutionMode::Auto);
    assert_eq!(s.start, vec!["w-003"]);
    assert_eq!(s.counts.running, 3);
    assert_eq!(s.progress, "3/6");
}

#[test]
fn a_blocked_task_or_a_pause_stops_new_starts_but_not_running_ones() {
    let p = plan(
        "up",
        &upgrade_spec(IntOrString::Int(2)),
        &cluster(1, 4),
        None,
    )
    .unwrap()
    .plan;
    let mut tasks = views(&p, NodeTaskPhase::Pending);
    tasks.get_mut("cp-0").unwrap().phase = NodeTaskPhase::Succeeded;
    tasks.get_mut("w-000").unwrap().phase = NodeTaskPhase::Blocked;
    let s = schedule(&p, &tasks, &everyone(&p), false, ExecutionMode::Auto);
    assert!(s.start.is_empty());
    assert_eq!(s.phase, OperationPhase::Blocked);
    assert!(
        s.message.contains("w-000") && s.message.contains("retry"),
        "{}",
        s.message
    );

    // After a Skip the rollout goes on.
    let skipped =
        task_transition(NodeTaskPhase::Blocked, TaskEvent::Recovery(Recovery::Skip)).unwrap();
    tasks.get_mut("w-000").unwrap().phase = skipped;
    let s = schedule(&p, &tasks, &everyone(&p), false, ExecutionMode::Auto);
    assert_eq!(s.start, vec!["w-001", "w-002"]);

    let s = schedule(&p, &tasks, &everyone(&p), true, ExecutionMode::Auto);
    assert!(s.start.is_empty());
    assert_eq!(s.phase, OperationPhase::Paused);
    assert!(s.message.contains("paused"));
}

#[test]
fn controlled_mode_holds_the_slot_until_approved() {
    let p = plan(
        "c",
        &upgrade_spec(IntOrString::Int(2)),
        &cluster(1, 3),
        None,
    )
    .unwrap()
    .plan;
    let mut tasks = views(&p, NodeTaskPhase::Pending);
    let s = schedule(&p, &tasks, &everyone(&p), false, ExecutionMode::Controlled);
    assert_eq!(s.await_approval, vec!["cp-0"]);
    assert!(s.start.is_empty());
    assert_eq!(s.phase, OperationPhase::AwaitingApproval);
    assert!(s.message.contains("approve"));

    tasks.get_mut("cp-0").unwrap().phase = NodeTaskPhase::AwaitingApproval;
    let s = schedule(&p, &tasks, &everyone(&p), false, ExecutionMode::Controlled);
    assert!(
        s.start.is_empty() && s.await_approval.is_empty(),
        "nothing else moves while cp-0 waits: {s:?}"
    );

    tasks.get_mut("cp-0").unwrap().approve = true;
    let s = schedule(&p, &tasks, &everyone(&p), false, ExecutionMode::Controlled);
    assert_eq!(s.start, vec!["cp-0"]);

    // A task approved in advance starts directly when its turn comes.
    tasks.get_mut("cp-0").unwrap().phase = NodeTaskPhase::Succeeded;
    tasks.get_mut("w-001").unwrap().approve = true;
    let s = schedule(&p, &tasks, &everyone(&p), false, ExecutionMode::Controlled);
    assert_eq!(s.await_approval, vec!["w-000"]);
    assert_eq!(s.start, vec!["w-001"]);
}

#[test]
fn a_vanished_node_makes_its_task_invalid_and_the_rollout_goes_on() {
    let p = plan(
        "up",
        &upgrade_spec(IntOrString::Int(1)),
        &cluster(1, 3),
        None,
    )
    .unwrap()
    .plan;
    let mut tasks = views(&p, NodeTaskPhase::Pending);
    tasks.get_mut("cp-0").unwrap().phase = NodeTaskPhase::Succeeded;
    tasks.get_mut("w-000").unwrap().phase = NodeTaskPhase::Running;
    let mut present = everyone(&p);
    present.remove("w-000");
    present.remove("cp-0"); // finished tasks stay as they are
    let s = schedule(&p, &tasks, &present, false, ExecutionMode::Auto);
    assert_eq!(s.invalidate, vec!["w-000"]);
    assert_eq!(
        s.start,
        vec!["w-001"],
        "the slot of the vanished node is free again"
    );
    assert_eq!(s.counts.invalid, 1);
    assert_eq!(s.counts.succeeded, 1);

    // Every remaining task finishes: the Operation succeeds and names the vanished node.
    for n in ["w-001", "w-002"] {
        tasks.get_mut(n).unwrap().phase = NodeTaskPhase::Succeeded;
    }
    tasks.get_mut("w-000").unwrap().phase = NodeTaskPhase::Invalid;
    let s = schedule(&p, &tasks, &present, false, ExecutionMode::Auto);
    assert_eq!(s.phase, OperationPhase::Succeeded);
    assert!(
        s.message.contains("w-000") && s.message.contains("left the cluster"),
        "{}",
        s.message
    );
    assert_eq!(s.progress, "4/4");
}

#[test]
fn an_operation_whose_every_node_was_skipped_says_nothing_was_done() {
    let p = plan(
        "u",
        &upgrade_spec(IntOrString::Int(1)),
        &cluster(1, 3),
        None,
    )
    .unwrap()
    .plan;
    let present = everyone(&p);
    let skipped = views(&p, NodeTaskPhase::Skipped);
    let s = schedule(&p, &skipped, &present, false, ExecutionMode::Auto);
    assert_eq!(s.phase, OperationPhase::Succeeded);
    assert_eq!(s.counts.skipped, 4);
    assert_eq!(
        s.message,
        "finished with nothing done: no node succeeded (4 skipped, 0 invalid)"
    );
    // One node succeeded: the usual account.
    let mut one = skipped.clone();
    one.get_mut("cp-0").unwrap().phase = NodeTaskPhase::Succeeded;
    let s = schedule(&p, &one, &present, false, ExecutionMode::Auto);
    assert_eq!(s.message, "finished: 1 succeeded, 3 skipped, 0 invalid");
}

#[test]
fn control_plane_nodes_never_run_together_even_in_a_wide_custom_group() {
    let groups = vec![CustomGroup {
        name: "all".into(),
        node_selector: None,
        steps: vec![custom_step("s")],
    }];
    let p = plan(
        "c",
        &custom_spec(groups, IntOrString::String("100%".into())),
        &cluster(3, 3),
        None,
    )
    .unwrap()
    .plan;
    let s = schedule(
        &p,
        &views(&p, NodeTaskPhase::Pending),
        &everyone(&p),
        false,
        ExecutionMode::Auto,
    );
    assert_eq!(s.start, vec!["cp-0", "w-000", "w-001", "w-002"]);
}

/// Runs a whole rollout: each round applies the schedule, then finishes the running task
/// that started first. Checks the invariants at every round, for many cluster shapes and
/// limits, in Auto and Controlled mode.
#[test]
fn simulated_rollouts_respect_every_limit_and_run_each_node_once() {
    let limits: Vec<IntOrString> = [1, 2, 3, 7]
        .into_iter()
        .map(IntOrString::Int)
        .chain(
            ["1%", "10%", "25%", "33%", "50%", "99%", "100%"]
                .into_iter()
                .map(|s| IntOrString::String(s.into())),
        )
        .collect();
    let mut runs = 0;
    for cp in 1..=3 {
        for workers in 0..=24 {
            for limit in &limits {
                for mode in [ExecutionMode::Auto, ExecutionMode::Controlled] {
                    simulate(cp, workers, limit.clone(), mode);
                    runs += 1;
                }
            }
        }
    }
    assert_eq!(runs, 3 * 25 * 11 * 2);
}

fn simulate(cp: usize, workers: usize, limit: IntOrString, mode: ExecutionMode) {
    let ctx = format!("{cp} cp, {workers} workers, {limit:?}, {mode:?}");
    let mut spec = upgrade_spec(limit);
    spec.execution_mode = mode;
    let out = plan("op", &spec, &cluster(cp, workers), None).unwrap();
    let p = out.plan;
    let present = everyone(&p);
    let group_of: BTreeMap<&str, usize> = p
        .groups
        .iter()
        .enumerate()
        .flat_map(|(i, g)| g.nodes.iter().map(move |n| (n.as_str(), i)))
        .collect();
    let cps: BTreeSet<&str> = p
        .groups
        .iter()
        .flat_map(|g| g.control_plane_nodes.iter().map(String::as_str))
        .collect();
    assert_eq!(cps.len(), cp, "{ctx}");

    let mut tasks: BTreeMap<String, TaskView> = BTreeMap::new();
    let mut started_order: Vec<String> = Vec::new();
    let mut finished_order: Vec<String> = Vec::new();
    for round in 0..10_000 {
        let s = schedule(&p, &tasks, &present, false, mode);
        for n in &s.create {
            tasks.insert(
                n.clone(),
                TaskView {
                    phase: NodeTaskPhase::Pending,
                    approve: false,
                },
            );
        }
        for n in &s.await_approval {
            let t = tasks.get_mut(n).unwrap();
            t.phase = task_transition(
                t.phase,
                TaskEvent::TurnCame {
                    needs_approval: true,
                },
            )
            .unwrap();
            t.approve = true; // the person approves right away
        }
        for n in &s.start {
            let t = tasks.get_mut(n).unwrap();
            let event = if t.phase == NodeTaskPhase::AwaitingApproval {
                TaskEvent::Approved
            } else {
                TaskEvent::TurnCame {
                    needs_approval: false,
                }
            };
            t.phase = task_transition(t.phase, event).unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert!(!started_order.contains(n), "{ctx}: {n} started twice");
            started_order.push(n.clone());
        }

        // Invariants after applying the round.
        let holding: Vec<&str> = tasks
            .iter()
            .filter(|(_, t)| t.phase.occupies_slot())
            .map(|(n, _)| n.as_str())
            .collect();
        let cps_holding = holding.iter().filter(|n| cps.contains(*n)).count();
        assert!(
            cps_holding <= 1,
            "{ctx}: control-plane nodes {holding:?} at once"
        );
        let groups_holding: BTreeSet<usize> = holding.iter().map(|n| group_of[n]).collect();
        assert!(
            groups_holding.len() <= 1,
            "{ctx}: several groups at once: {holding:?}"
        );
        if let Some(g) = groups_holding.first() {
            assert!(
                holding.len() <= p.groups[*g].max_parallel as usize,
                "{ctx}: {holding:?} exceed {}",
                p.groups[*g].max_parallel
            );
            for earlier in &p.groups[..*g] {
                assert!(
                    earlier.nodes.iter().all(|n| tasks[n].phase.is_finished()),
                    "{ctx}: group {} started early",
                    p.groups[*g].name
                );
            }
        }

        if s.phase == OperationPhase::Succeeded {
            assert_eq!(finished_order.len(), cp + workers, "{ctx}");
            let planned: Vec<&str> = p.node_names().collect();
            assert_eq!(
                started_order, planned,
                "{ctx}: nodes must start in plan order"
            );
            return;
        }
        // Finish the earliest-started running task (whose approval, in Controlled mode,
        // was given above and took effect this round or the next).
        if let Some(n) = started_order
            .iter()
            .find(|n| tasks[*n].phase == NodeTaskPhase::Running)
            .cloned()
        {
            let t = tasks.get_mut(&n).unwrap();
            t.phase = task_transition(t.phase, TaskEvent::StepsDone).unwrap();
            finished_order.push(n);
        }
        assert!(round < 9_999, "{ctx}: the rollout did not finish");
    }
}

#[test]
fn the_etcd_steps_follow_spec_upgrade_etcd() {
    use bosun_api::operation::EtcdSafety;
    // (healthCheck, snapshot, the first control plane's first steps, the second's)
    let cases: [(bool, bool, &[&str], &[&str]); 4] = [
        (
            true,
            true,
            &["etcd-health", "etcd-snapshot", "cordon"],
            &["etcd-health", "cordon"],
        ),
        (false, true, &["etcd-snapshot", "cordon"], &["cordon"]),
        (
            true,
            false,
            &["etcd-health", "cordon"],
            &["etcd-health", "cordon"],
        ),
        (false, false, &["cordon"], &["cordon"]),
    ];
    for (health_check, snapshot, first, second) in cases {
        let mut spec = upgrade_spec(IntOrString::Int(1));
        let upgrade = spec.upgrade.as_mut().unwrap();
        upgrade.etcd = EtcdSafety {
            health_check,
            snapshot,
            keep_snapshots: 5,
        };
        let out = plan("op", &spec, &cluster(2, 1), None).unwrap();
        let names = |i: usize| step_names(&out.tasks[i].spec.steps);
        assert_eq!(&names(0)[..first.len()], first, "{health_check} {snapshot}");
        assert_eq!(
            &names(1)[..second.len()],
            second,
            "{health_check} {snapshot}"
        );
        assert_eq!(names(2)[0], "cordon", "workers have no etcd step");
        if snapshot {
            let step = out.tasks[0]
                .spec
                .steps
                .iter()
                .find(|s| s.name == "etcd-snapshot")
                .unwrap();
            assert_eq!(step.params.as_ref().unwrap()["keep"], 5);
        }
    }
}

/// The etcd snapshot's label names one Operation: its name and the start of its UID, so a
/// later Operation of the same name does not find the earlier one's snapshot as its own.
#[test]
fn the_snapshot_label_carries_the_start_of_the_uid() {
    let spec = upgrade_spec(IntOrString::Int(1));
    let label_of = |uid: Option<&str>| {
        let identity = uid.map(|uid| OperationIdentity {
            uid: uid.into(),
            created: "2026-12-06T15:04:05Z".into(),
        });
        let out = plan_identified("up", identity.as_ref(), &spec, &cluster(1, 0), None).unwrap();
        let steps = &out.tasks[0].spec.steps;
        let snapshot = steps.iter().find(|s| s.name == "etcd-snapshot").unwrap();
        snapshot.params.as_ref().unwrap()["label"].clone()
    };
    assert_eq!(
        label_of(Some("0F1e2d3c-4b5a-6978-8695-a4b3c2d1e0f9")),
        "up-0f1e2d3c"
    );
    assert_eq!(
        label_of(Some("aaaaaaaa-0000-0000-0000-000000000000")),
        "up-aaaaaaaa"
    );
    assert_eq!(label_of(None), "up");
    // Long names still give a label value (at most 63 characters), distinct per UID.
    let long = "u".repeat(80);
    let a = snapshot_label(&long, Some("11111111-x"));
    let b = snapshot_label(&long, Some("22222222-x"));
    assert!(a.len() <= 63 && b.len() <= 63 && a != b, "{a} {b}");
}
