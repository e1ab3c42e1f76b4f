//! The docs' console transcripts that need no cluster, run for real: a sample in the docs
//! can no longer go stale unnoticed. The format and the matching are in [`transcript`];
//! pages whose transcripts need a cluster (first-operation.md, troubleshooting.md) run
//! against a lab in `tests/e2e/tests/doc_transcripts_lab.rs`.
//!
//! Each block runs in a fresh empty directory as one `bash` session (so `cd` and variables
//! carry over from one command to the next, as in a terminal), with the `kubectl-bosun`
//! under test first on `PATH`. In the output, the session directory becomes `.`, the
//! checkout `~/src/bosun`, the plugin build directory `disk-report/target`, and `$HOME` `~`.
//!
//! The session's `$HOME` is a fresh directory holding `src/bosun`, a link to this checkout
//! (the docs say "your checkout is ~/src/bosun"). Cargo builds go to a target directory
//! shared with the other CLI tests (`CARGO_TARGET_DIR`, shown as `disk-report/target`),
//! offline, so only the first run compiles the plugin SDK's dependencies.

use crate::transcript;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use transcript::{Block, Session};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

/// `$VAR`, or `$HOME/dir` of the user running the tests.
fn tool_home(var: &str, dir: &str) -> PathBuf {
    std::env::var_os(var).map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(dir),
        PathBuf::from,
    )
}

/// Runs a block in a fresh session; returns every mismatch, described.
fn run_block(block: &Block) -> Vec<String> {
    let session = tempfile::tempdir().unwrap();
    let session_dir = session.path().canonicalize().unwrap();
    let work = session_dir.join("work");
    let home = session_dir.join("home");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(home.join("src")).unwrap();
    std::os::unix::fs::symlink(workspace_root(), home.join("src/bosun")).unwrap();
    let plugin_target = target_dir().join("cli-test-plugins");
    std::fs::create_dir_all(&plugin_target).unwrap();
    // The build directory is shared: a signature bundle left by an earlier run would be
    // appended to (`plugin sign` adds to an existing bundle).
    let _ =
        std::fs::remove_file(plugin_target.join("wasm32-wasip2/release/disk_report.wasm.sig.json"));

    let bin_dir = Path::new(env!("CARGO_BIN_EXE_kubectl-bosun"))
        .parent()
        .unwrap()
        .to_owned();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut env: Vec<(OsString, OsString)> = vec![
        ("PATH".into(), path.into()),
        ("HOME".into(), home.clone().into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("CARGO_TARGET_DIR".into(), plugin_target.clone().into()),
        ("CARGO_NET_OFFLINE".into(), "true".into()),
        // $HOME is the session's: cargo and rustup are told where they really live.
        (
            "CARGO_HOME".into(),
            tool_home("CARGO_HOME", ".cargo").into(),
        ),
        (
            "RUSTUP_HOME".into(),
            tool_home("RUSTUP_HOME", ".rustup").into(),
        ),
    ];
    env.extend(std::env::var_os("RUSTUP_TOOLCHAIN").map(|v| ("RUSTUP_TOOLCHAIN".into(), v)));
    let replacements = vec![
        (
            plugin_target.display().to_string(),
            "disk-report/target".to_owned(),
        ),
        (format!("{}/", work.display()), String::new()),
        (work.display().to_string(), ".".to_owned()),
        (
            workspace_root().display().to_string(),
            "~/src/bosun".to_owned(),
        ),
        (home.display().to_string(), "~".to_owned()),
    ];
    transcript::run(
        &[block],
        &Session {
            cwd: work,
            env,
            replacements,
            loose: false,
            stop_background: false,
        },
    )
}

/// Runs the transcripts of one doc page, each block in its own session, and fails listing
/// every command whose output differs. `at_least` guards against a marker lost in an edit.
fn check_page(page: &str, at_least: usize) {
    let blocks = transcript::page_blocks(&workspace_root(), page, false, at_least);
    let problems: Vec<String> = blocks.iter().flat_map(run_block).collect();
    transcript::assert_no_problems(&format!("docs/{page}"), &problems);
}

#[test]
fn plugins_md_transcripts_are_true() {
    check_page("plugins.md", 1);
}

#[test]
fn policy_md_transcripts_are_true() {
    check_page("policy.md", 1);
}

#[test]
fn cli_md_transcripts_are_true() {
    check_page("cli.md", 0);
}

/// The matcher itself: placeholders match what they should and nothing more.
#[test]
fn the_matcher_keeps_values_that_matter() {
    transcript::check_the_matcher();
}
