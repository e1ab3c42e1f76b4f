//! `kubectl-bosun policy test` and `policy eval`, run as a user would: the real binary,
//! the shipped library, exit codes and output.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kubectl-bosun"))
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(args: &[&str]) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = bin()
        .args(args)
        .current_dir(root())
        .output()
        .expect("kubectl-bosun runs");
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

#[test]
fn policy_test_passes_on_the_shipped_library_and_fails_on_a_broken_test() {
    let (code, out, err) = run(&["policy", "test", "policies"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains(", 0 failed"), "{out}");
    assert!(
        out.contains("PASS rego") && out.contains("PASS case"),
        "both kinds ran: {out}"
    );

    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p");
    std::fs::create_dir_all(&p).unwrap();
    std::fs::write(
        p.join("policy.rego"),
        "package bosun.step.p\n\ndeny contains \"always\" if true\n",
    )
    .unwrap();
    std::fs::write(p.join("policy_test.rego"), "package bosun.step.p_test\n\nimport data.bosun.step.p\n\ntest_never_denies if count(p.deny) == 0\n").unwrap();
    let (code, out, err) = run(&["policy", "test", p.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        out.contains("FAIL rego") && out.contains("test_never_denies"),
        "{out}"
    );
    assert!(err.contains("1 of 1 policy tests failed"), "{err}");

    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let (code, _, err) = run(&["policy", "test", empty.to_str().unwrap()]);
    assert_eq!(code, 1, "a directory without tests must not pass: {err}");
}

#[test]
fn policy_eval_explains_and_exits_2_on_deny() {
    let (code, out, err) = run(&[
        "policy",
        "eval",
        "--input",
        "policies/schema/examples/step.json",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.starts_with("decision at step: ALLOWED"), "{out}");
    assert!(
        out.contains("not evaluated at this point"),
        "capabilities policies are listed but not asked: {out}"
    );

    // The same input with the cluster frozen: change-freeze denies and says why.
    let mut input: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("policies/schema/examples/step.json")).unwrap(),
    )
    .unwrap();
    input["cluster"]["annotations"]["bosun.dev/change-freeze"] = "true".into();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("frozen.json");
    std::fs::write(&file, input.to_string()).unwrap();
    let (code, out, err) = run(&[
        "policy",
        "eval",
        "--input",
        file.to_str().unwrap(),
        "--policy",
        "policies/change-freeze",
        "-o",
        "json",
    ]);
    assert_eq!(code, 2, "{out}\n{err}");
    let explained: serde_json::Value = serde_json::from_str(&out).expect("JSON output");
    assert_eq!(explained["decision"]["allowed"], false);
    assert_eq!(
        explained["decision"]["denies"][0]["policy"],
        "change-freeze"
    );
    let rules = explained["policies"][0]["rules"].as_array().unwrap();
    assert!(
        rules
            .iter()
            .any(|r| r["name"] == "deny" && r["fired"] == true),
        "{rules:?}"
    );

    let (code, _, err) = run(&[
        "policy",
        "eval",
        "--input",
        file.to_str().unwrap(),
        "--point",
        "operation",
        "--policy",
        "policies/change-freeze",
    ]);
    assert_eq!(
        code, 0,
        "no operation policy in that directory: allowed ({err})"
    );
    assert!(
        err.contains("does not match the operation input schema"),
        "{err}"
    );
}

/// `policy eval -o json | head`: a reader that goes away is no error of ours. Every
/// command exits quietly (no panic message, exit 141 as for SIGPIPE) when its stdout is a
/// pipe nobody reads. The pipe's read end is closed before the command starts, so every
/// write fails with EPIPE, whatever the timing.
#[test]
fn every_command_exits_quietly_when_the_reader_of_its_output_is_gone() {
    for args in [
        &[
            "policy",
            "eval",
            "-o",
            "json",
            "--input",
            "policies/schema/examples/step.json",
        ][..],
        &["policy", "test", "policies"][..],
        &[
            "policy",
            "eval",
            "--input",
            "policies/schema/examples/step.json",
        ][..],
    ] {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let out = bin()
            .args(args)
            .current_dir(root())
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("kubectl-bosun runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: a closed stdout must not be reported: {err}"
        );
        assert_eq!(out.status.code(), Some(141), "{args:?}: {err}");
    }
}

/// The example Policy manifests under deploy/examples are tested with the library: their
/// cases files (policies/deploy-examples) name the manifest (`policies:`), and the cases go
/// through the same decision path. A shipped policy must not read the clock (time.now_ns): decisions replay with
/// input.now.
#[test]
fn the_example_policies_pass_their_cases_and_read_the_time_from_the_input() {
    let (code, out, err) = run(&["policy", "test", "policies"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(
        out.matches("PASS case policies/deploy-examples/policy-maintenance-window.cases.yaml")
            .count(),
        6,
        "{out}"
    );
    for dir in ["deploy/examples", "policies"] {
        for entry in walk(&root().join(dir)) {
            let text = std::fs::read_to_string(&entry).unwrap_or_default();
            let is_policy =
                entry.extension().is_some_and(|e| e == "rego") || text.contains("kind: Policy\n");
            let code = text
                .lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .any(|l| l.contains("time.now_ns"));
            assert!(
                !is_policy || !code,
                "{} reads the clock; use input.now so decisions can be replayed",
                entry.display()
            );
        }
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
