//! The shipped policy library (`policies/`): every Rego `test_` rule and every
//! data-driven case, through the same harness as `kubectl-bosun policy test`; plus the
//! input schemas and their examples.

use std::path::{Path, PathBuf};

use bosun_policy::{DecisionPoint, TestKind, input};

fn policies_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../policies")
        .canonicalize()
        .expect("policies/ exists")
}

#[test]
fn shipped_library_passes_its_rego_tests_and_cases() {
    // The policies' logic is under test here, not the machine's speed: under a loaded CI
    // machine one case took 256 ms against the agents' 250 ms budget. The budget itself is
    // tested in engine.rs.
    let limits = bosun_policy::Limits {
        eval_timeout: std::time::Duration::from_secs(10),
        ..Default::default()
    };
    let report =
        bosun_policy::test_dir_with(&policies_dir(), limits).expect("policies/ holds tests");
    println!("{report}");
    assert!(report.is_success(), "{report}");
    // Every shipped policy directory has both kinds of test.
    let dirs: Vec<PathBuf> = std::fs::read_dir(policies_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("policy.rego").exists())
        .collect();
    assert!(
        dirs.len() >= 7,
        "expected the seven shipped policies, found {dirs:?}"
    );
    for d in &dirs {
        for kind in [TestKind::Rego, TestKind::Case] {
            let n = report
                .results
                .iter()
                .filter(|r| r.kind == kind && r.file.starts_with(d))
                .count();
            assert!(
                n >= 3,
                "{} has {n} {kind:?} tests; expected at least 3",
                d.display()
            );
        }
    }
}

#[test]
fn a_failing_case_or_test_is_reported_as_failed() {
    let dir = tempfile_dir();
    std::fs::write(
        dir.join("policy.rego"),
        "package bosun.step.demo\ndeny contains \"always\" if input.now\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("policy_test.rego"),
        "package bosun.step.demo_test\nimport data.bosun.step.demo\ntest_passes if demo.deny == {\"always\"} with input as {\"now\": \"x\"}\ntest_fails if count(demo.deny) == 0 with input as {\"now\": \"x\"}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("cases.yaml"),
        format!(
            "base: {}\ncases:\n  - name: right\n    input: {{}}\n    denies: [always]\n  - name: wrong\n    input: {{}}\n    denies: []\n  - name: invalid input\n    input: {{nonsense: 1}}\n    denies: [always]\n",
            policies_dir().join("schema/examples/step.json").display()
        ),
    )
    .unwrap();
    let report = bosun_policy::test_dir(&dir).unwrap();
    let failed: Vec<&str> = report
        .results
        .iter()
        .filter(|r| r.failure.is_some())
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(
        failed,
        vec!["test_fails", "wrong", "invalid input"],
        "{report}"
    );
    assert_eq!(report.passed(), 2);
    assert!(!report.is_success());
    let invalid = report
        .results
        .iter()
        .find(|r| r.name == "invalid input")
        .unwrap();
    assert!(
        invalid.failure.as_ref().unwrap().contains("nonsense"),
        "{report}"
    );
    assert!(report.to_string().ends_with("2 passed, 3 failed\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_directory_without_tests_is_an_error() {
    let dir = tempfile_dir();
    let err = bosun_policy::test_dir(&dir).unwrap_err().to_string();
    assert!(err.contains("no tests found"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "bosun-policy-test-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn checked_in_schemas_match_the_input_types() {
    for (point, schema) in input::schemas() {
        let path = policies_dir().join(format!("schema/{point}.schema.json"));
        let want = serde_json::to_string_pretty(&schema).unwrap() + "\n";
        if std::env::var_os("BOSUN_UPDATE_SCHEMAS").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "{} is out of date with the input types in runtime/policy/src/input.rs: regenerate it with `BOSUN_UPDATE_SCHEMAS=1 cargo test -p bosun-policy --test policy library::`",
            path.display()
        );
    }
}

#[test]
fn documented_examples_are_valid_inputs() {
    for point in DecisionPoint::ALL {
        let path = policies_dir().join(format!("schema/examples/{point}.json"));
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        input::validate(point, &doc).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        // A field the schema does not know is refused, not ignored.
        let mut extra = doc.clone();
        extra["unexpected"] = serde_json::json!(1);
        assert!(input::validate(point, &extra).is_err());
    }
}
