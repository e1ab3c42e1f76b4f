//! The engine wrapper's guarantees: routing by package, enforcement, attribution,
//! digests, compile errors with locations, and failing closed.

use std::time::Duration;

use bosun_policy::{DecisionPoint, Enforcement, Limits, PolicySet, PolicySource};
use serde_json::json;

fn policy(name: &str, rego: &str, enforcement: Enforcement) -> PolicySource {
    PolicySource {
        name: name.into(),
        rego: rego.into(),
        data: None,
        enforcement,
    }
}

const DENY_ALWAYS: &str = r#"package bosun.step.always
deny contains "no steps today"
"#;

const DENY_ON_INPUT: &str = r#"package bosun.step.node_hold
deny contains msg if {
    input.node.annotations["bosun.dev/hold"] == "true"
    msg := sprintf("node %s is on hold", [input.node.name])
}
"#;

#[test]
fn enforcement_decides_what_a_deny_does() {
    let set = PolicySet::compile(
        &[
            policy("deny", DENY_ALWAYS, Enforcement::Deny),
            policy(
                "warn",
                &DENY_ALWAYS.replace("always", "warned"),
                Enforcement::Warn,
            ),
            policy(
                "audit",
                &DENY_ALWAYS.replace("always", "audited"),
                Enforcement::Audit,
            ),
        ],
        Limits::default(),
    );
    assert!(set.is_healthy(), "{:?}", set.statuses());
    let d = set.evaluator().evaluate(DecisionPoint::Step, &json!({}));
    assert!(!d.allowed);
    assert_eq!(d.deny_messages(), vec!["deny: no steps today"]);
    assert_eq!(d.warnings.len(), 1);
    assert_eq!(d.warnings[0].policy, "warn");
    assert_eq!(d.audits.len(), 1);
    assert_eq!(d.audits[0].policy, "audit");
    assert_eq!(d.policy_set_digest, set.digest());

    // Warn and Audit alone never block.
    let set = PolicySet::compile(
        &[
            policy("warn", DENY_ALWAYS, Enforcement::Warn),
            policy(
                "audit",
                &DENY_ALWAYS.replace("always", "audited"),
                Enforcement::Audit,
            ),
        ],
        Limits::default(),
    );
    let d = set.evaluator().evaluate(DecisionPoint::Step, &json!({}));
    assert!(d.allowed);
    assert!(d.denies.is_empty());
    assert_eq!(d.warnings.len() + d.audits.len(), 2);
}

#[test]
fn packages_route_policies_to_their_decision_point() {
    let op = "package bosun.operation\ndeny contains \"operation denied\"\n";
    let caps = "package bosun.capabilities.limits\ndeny contains \"capabilities denied\"\n";
    let set = PolicySet::compile(
        &[
            policy("op", op, Enforcement::Deny),
            policy("step", DENY_ALWAYS, Enforcement::Deny),
            policy("caps", caps, Enforcement::Deny),
        ],
        Limits::default(),
    );
    let mut ev = set.evaluator();
    for (point, only) in [
        (DecisionPoint::Operation, "operation denied"),
        (DecisionPoint::Step, "no steps today"),
        (DecisionPoint::Capabilities, "capabilities denied"),
    ] {
        let d = ev.evaluate(point, &json!({}));
        let msgs: Vec<&str> = d.denies.iter().map(|f| f.message.as_str()).collect();
        assert_eq!(msgs, vec![only], "at {point}");
    }
    let statuses = set.statuses();
    assert_eq!(statuses[1].package.as_deref(), Some("bosun.step.always"));
    assert_eq!(statuses[1].point, Some(DecisionPoint::Step));
}

#[test]
fn input_reaches_the_policy() {
    let set = PolicySet::compile(
        &[policy("hold", DENY_ON_INPUT, Enforcement::Deny)],
        Limits::default(),
    );
    let mut ev = set.evaluator();
    let held = json!({"node": {"name": "cp-1", "annotations": {"bosun.dev/hold": "true"}}});
    let free = json!({"node": {"name": "cp-1", "annotations": {}}});
    assert_eq!(
        ev.evaluate(DecisionPoint::Step, &held).deny_messages(),
        vec!["hold: node cp-1 is on hold"]
    );
    assert!(ev.evaluate(DecisionPoint::Step, &free).allowed);
}

#[test]
fn compile_errors_carry_policy_line_and_column() {
    let bad = "package bosun.step.typo\n\ndeny contains msg if {\n    msg := = \"x\"\n}\n";
    let set = PolicySet::compile(
        &[
            policy("ok", DENY_ON_INPUT, Enforcement::Deny),
            policy("typo", bad, Enforcement::Audit),
        ],
        Limits::default(),
    );
    assert!(!set.is_healthy());
    let st = &set.statuses()[1];
    assert!(!st.compiled);
    let e = &st.errors[0];
    assert_eq!(e.policy, "typo");
    assert_eq!(e.line, Some(4), "{e:?}");
    assert!(e.column.is_some_and(|c| c >= 5), "{e:?}");
    assert!(e.to_string().starts_with("typo:4:"), "{e}");
}

#[test]
fn a_broken_policy_blocks_every_point_whatever_its_enforcement() {
    let unknown_fn =
        "package bosun.step.x\ndeny contains msg if {\n  msg := no_such_function(input)\n}\n";
    let set = PolicySet::compile(
        &[policy("broken", unknown_fn, Enforcement::Audit)],
        Limits::default(),
    );
    assert!(
        !set.is_healthy(),
        "an unknown function must be a compile error: {:?}",
        set.statuses()
    );
    let e = &set.statuses()[0].errors[0];
    assert_eq!(e.line, Some(3), "{e:?}");
    let mut ev = set.evaluator();
    for point in DecisionPoint::ALL {
        let d = ev.evaluate(point, &json!({}));
        assert!(!d.allowed, "{point}");
        assert_eq!(d.denies[0].policy, "broken");
        assert!(
            d.denies[0].message.contains("policy is broken"),
            "{}",
            d.denies[0].message
        );
        assert!(
            d.denies[0].message.contains("broken:3:"),
            "{}",
            d.denies[0].message
        );
    }
}

#[test]
fn policies_that_could_never_decide_do_not_compile() {
    let outside = policy(
        "outside",
        "package mycompany\ndeny contains \"x\"\n",
        Enforcement::Deny,
    );
    let no_deny = policy(
        "nodeny",
        "package bosun.step.nodeny\ndenny contains \"x\"\n",
        Enforcement::Deny,
    );
    let mut reserved = policy("reserved", DENY_ALWAYS, Enforcement::Deny);
    reserved.data = Some(json!({"bosun": {"step": {}}}));
    let mut not_object = policy("notobject", DENY_ALWAYS, Enforcement::Deny);
    not_object.data = Some(json!([1, 2]));
    let dup = policy("outside", DENY_ALWAYS, Enforcement::Deny);
    let set = PolicySet::compile(
        &[outside, no_deny, reserved, not_object, dup],
        Limits::default(),
    );
    let st = set.statuses();
    assert!(st.iter().all(|s| !s.compiled));
    assert!(
        st[0].errors[0]
            .message
            .contains("mycompany is not evaluated anywhere")
    );
    assert!(st[1].errors[0].message.contains("declares no `deny` rule"));
    assert!(
        st[2].errors[0]
            .message
            .contains("reserved for policy packages")
    );
    assert!(st[3].errors[0].message.contains("must be a JSON object"));
    assert!(st[4].errors[0].message.contains("same name"));
}

#[test]
fn evaluation_errors_and_timeouts_fail_closed() {
    // A builtin error (unknown time zone) is an evaluation error, not an undefined deny.
    let tz = r#"package bosun.step.tz
deny contains "outside window" if {
    [h, _, _] := time.clock([time.parse_rfc3339_ns(input.now), "Mars/Olympus_Mons"])
    h > 100
}
"#;
    // Nine million iterations: far past a 5 ms budget on any machine.
    let slow = r#"package bosun.step.slow
deny contains "never reached" if {
    n := count([1 | some a in numbers.range(1, 3000); some b in numbers.range(1, 3000)])
    n < 0
}
"#;
    let limits = Limits {
        eval_timeout: Duration::from_millis(5),
        ..Limits::default()
    };
    let set = PolicySet::compile(
        &[
            policy("tz", tz, Enforcement::Warn),
            policy("slow", slow, Enforcement::Audit),
        ],
        limits,
    );
    assert!(set.is_healthy(), "{:?}", set.statuses());
    let d = set
        .evaluator()
        .evaluate(DecisionPoint::Step, &json!({"now": "2026-11-30T01:00:00Z"}));
    assert!(!d.allowed);
    let by = |name: &str| {
        d.denies
            .iter()
            .find(|f| f.policy == name)
            .map(|f| f.message.clone())
    };
    let tz_msg = by("tz").expect("tz denies");
    assert!(tz_msg.contains("policy is broken"), "{tz_msg}");
    let slow_msg = by("slow").expect("slow denies");
    assert!(slow_msg.contains("time limit"), "{slow_msg}");
    assert!(d.warnings.is_empty() && d.audits.is_empty());
}

#[test]
fn a_deny_that_is_not_a_set_of_messages_fails_closed() {
    let bool_deny = "package bosun.step.b\ndeny := true\n";
    let set = PolicySet::compile(
        &[policy("b", bool_deny, Enforcement::Warn)],
        Limits::default(),
    );
    let d = set.evaluator().evaluate(DecisionPoint::Step, &json!({}));
    assert!(!d.allowed);
    assert!(
        d.denies[0]
            .message
            .contains("expected deny to be a set of strings"),
        "{:?}",
        d.denies
    );
}

#[test]
fn digest_covers_sources_data_and_enforcement_but_not_order() {
    let a = policy("a", DENY_ALWAYS, Enforcement::Deny);
    let b = policy("b", DENY_ON_INPUT, Enforcement::Deny);
    let d1 = PolicySet::compile(&[a.clone(), b.clone()], Limits::default())
        .digest()
        .to_owned();
    let d2 = PolicySet::compile(&[b.clone(), a.clone()], Limits::default())
        .digest()
        .to_owned();
    assert_eq!(d1, d2);
    assert!(d1.starts_with("sha256:") && d1.len() == 7 + 64);
    let mut warn = a.clone();
    warn.enforcement = Enforcement::Warn;
    let mut with_data = a.clone();
    with_data.data = Some(json!({"x": 1, "y": [1, 2]}));
    let mut reordered_data = a.clone();
    reordered_data.data = Some(serde_json::from_str(r#"{"y": [1, 2], "x": 1}"#).unwrap());
    let mut edited = a.clone();
    edited.rego.push('\n');
    let digest = |p: &PolicySource| {
        PolicySet::compile(&[p.clone(), b.clone()], Limits::default())
            .digest()
            .to_owned()
    };
    assert_ne!(digest(&warn), d1);
    assert_ne!(digest(&with_data), d1);
    assert_ne!(digest(&edited), d1);
    assert_eq!(digest(&with_data), digest(&reordered_data));
}

#[test]
fn evaluators_run_on_their_own_threads() {
    let set = PolicySet::compile(
        &[policy("hold", DENY_ON_INPUT, Enforcement::Deny)],
        Limits::default(),
    );
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let mut ev = set.evaluator();
            std::thread::spawn(move || {
                let held = json!({"node": {"name": format!("n{i}"), "annotations": {"bosun.dev/hold": "true"}}});
                (0..50)
                    .map(|_| ev.evaluate(DecisionPoint::Step, &held).deny_messages())
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        for msgs in h.join().unwrap() {
            assert_eq!(msgs, vec![format!("hold: node n{i} is on hold")]);
        }
    }
}

#[test]
fn explain_names_the_rules_that_fired() {
    let rego = r#"package bosun.step.explained
held if input.node.annotations["bosun.dev/hold"] == "true"
frozen if input.cluster.annotations["bosun.dev/change-freeze"]
deny contains "node is held" if held
deny contains "cluster is frozen" if frozen
"#;
    let input = json!({"node": {"annotations": {"bosun.dev/hold": "true"}}, "cluster": {"annotations": {}}});
    let e = bosun_policy::explain(
        &[policy("explained", rego, Enforcement::Deny)],
        None,
        &input,
        DecisionPoint::Step,
    );
    assert_eq!(e.decision.deny_messages(), vec!["explained: node is held"]);
    let rules = &e.policies[0].rules;
    let rule = |n: &str| rules.iter().find(|r| r.name == n).unwrap();
    assert!(rule("held").fired);
    assert_eq!(rule("held").line, 2);
    assert!(!rule("frozen").fired);
    assert!(rule("frozen").value.is_none());
    assert!(rule("deny").fired);
    let text = e.to_string();
    assert!(
        text.contains("DENIED") && text.contains("fired   held:2"),
        "{text}"
    );

    // `data` given to explain overrides the policy's own.
    let with_data = r#"package bosun.step.d
deny contains "limit exceeded" if count(input.items) > data.limit
"#;
    let mut p = policy("d", with_data, Enforcement::Deny);
    p.data = Some(json!({"limit": 5}));
    let input = json!({"items": [1, 2, 3]});
    assert!(
        bosun_policy::explain(&[p.clone()], None, &input, DecisionPoint::Step)
            .decision
            .allowed
    );
    let e = bosun_policy::explain(
        &[p],
        Some(&json!({"limit": 2})),
        &input,
        DecisionPoint::Step,
    );
    assert!(!e.decision.allowed);
}

#[test]
fn decision_points_parse_from_names_and_queries() {
    for s in ["step", "bosun.step", "data.bosun.step.deny"] {
        assert_eq!(s.parse::<DecisionPoint>().unwrap(), DecisionPoint::Step);
    }
    let err = "data.other.deny"
        .parse::<DecisionPoint>()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("expected one of operation, step, capabilities"),
        "{err}"
    );
}

#[test]
fn perl_classes_work_in_regex_builtins() {
    let rego = r#"package bosun.step.re
deny contains "digits" if regex.match(`^\d+\s\w+$`, input.s)
"#;
    let set = PolicySet::compile(&[policy("re", rego, Enforcement::Deny)], Limits::default());
    let d = set
        .evaluator()
        .evaluate(DecisionPoint::Step, &json!({"s": "123 abc"}));
    assert_eq!(d.deny_messages(), vec!["re: digits"]);
}
