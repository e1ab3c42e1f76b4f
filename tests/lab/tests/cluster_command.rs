//! `lab cluster ...` runs the real-node cluster lab's script with the arguments as given.

use std::process::Command;

fn lab() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lab"))
}

#[test]
fn the_arguments_reach_the_script_unchanged_and_its_exit_status_is_the_commands() {
    let script = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("echo-cluster.sh");
    std::fs::write(&script, "printf '%s\\n' \"$@\"\nexit 3\n").unwrap();
    let out = lab()
        .env("BOSUN_CLUSTER_SCRIPT", &script)
        .args([
            "cluster",
            "up",
            "--version",
            "v1.33.13",
            "--control-planes",
            "2",
            "--help",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "up\n--version\nv1.33.13\n--control-planes\n2\n--help\n"
    );
    assert_eq!(out.status.code(), Some(3), "{out:?}");
}

#[test]
fn without_an_override_it_runs_the_checked_in_cluster_script() {
    // An unknown subcommand: the script itself refuses it (its usage as root, or that it
    // needs root), with its own prefix and exit status 1, not clap's (2).
    let out = lab()
        .env_remove("BOSUN_CLUSTER_SCRIPT")
        .args(["cluster", "no-such-subcommand"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("usage: cluster.sh up") || stderr.contains("needs root"),
        "{stderr}"
    );
}
