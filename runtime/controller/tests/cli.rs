//! The `bosun-controller` binary's command line. (Its work against a real API server is
//! proven by tests/e2e/tests/operator.rs.)

use std::process::Command;

#[test]
fn help_names_the_options() {
    let out = Command::new(env!("CARGO_BIN_EXE_bosun-controller"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in ["--field-manager", "--resync-seconds", "--log"] {
        assert!(text.contains(flag), "{flag} missing from:\n{text}");
    }
}

#[test]
fn an_unusable_kubeconfig_says_what_to_set() {
    let kubeconfig = std::env::temp_dir().join(format!(
        "bosun-controller-cli-{}/no-such-kubeconfig",
        std::process::id()
    ));
    let out = Command::new(env!("CARGO_BIN_EXE_bosun-controller"))
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("KUBECONFIG"), "{err}");
}
