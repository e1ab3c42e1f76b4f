//! The `bosun-agent` binary's command line: what it refuses before it touches a cluster.
//! (Its work against a real API server is proven by tests/e2e/tests/operator.rs.)

use std::process::Command;

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_bosun-agent"))
}

#[test]
fn a_trust_root_is_required() {
    let out = agent()
        .args(["--node-name", "n1", "--host-root", "/"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--trust-root"), "{err}");
}

#[test]
fn an_unreadable_trust_root_is_named_in_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-key.pub");
    let out = agent()
        .args(["--node-name", "n1", "--host-root"])
        .arg(dir.path())
        .arg("--trust-root")
        .arg(&missing)
        .arg("--plugin-dir")
        .arg(dir.path().join("plugins"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("loading the trust roots") && err.contains("no-such-key.pub"),
        "{err}"
    );
}

#[test]
fn simulated_services_are_refused_on_a_real_root() {
    let dir = tempfile::tempdir().unwrap();
    let out = agent()
        .args([
            "--node-name",
            "n1",
            "--host-root",
            "/",
            "--service-backend",
            "simulated",
            "--trust-root",
        ])
        .arg(dir.path().join("key.pub"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--service-backend=simulated with --host-root /"),
        "{err}"
    );
    // A lab node's directory gets past that check (and then fails on the missing key).
    let out = agent()
        .args([
            "--node-name",
            "n1",
            "--service-backend",
            "simulated",
            "--host-root",
        ])
        .arg(dir.path())
        .arg("--trust-root")
        .arg(dir.path().join("key.pub"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !err.contains("--service-backend=simulated with")
            && err.contains("loading the trust roots"),
        "{err}"
    );
}
