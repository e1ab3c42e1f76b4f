//! Build script of Bosun's binaries (agent, controller, `kubectl-bosun`): records the git
//! commit they are built from as `BOSUN_GIT_COMMIT`, which `--version` prints beside the
//! workspace's version.
//!
//! The commit comes from the environment variable `BOSUN_GIT_COMMIT` when it is set (a
//! build from a source archive, with no `.git`), else from `git rev-parse` in the source
//! tree, else it is `unknown`. Cargo reruns this script when the variable changes or when
//! `HEAD` moves, and at no other time.

// A build script speaks to Cargo on stdout (the CLI's clippy.toml forbids `println!`
// elsewhere, where output must go through its terminal escaping).
#![allow(clippy::disallowed_macros)]

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=BOSUN_GIT_COMMIT");
    let commit = std::env::var("BOSUN_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(commit_from_git)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=BOSUN_GIT_COMMIT={}", commit.trim());
}

fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")?;
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

fn commit_from_git() -> Option<String> {
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    // Watch what moves when a commit is made or checked out: HEAD itself, the branch it
    // names, and the packed refs (only the files that exist: a missing one would make Cargo
    // rerun this script, and rebuild the crate, on every build).
    let mut watched = vec!["HEAD".to_owned()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    watched.push("packed-refs".to_owned());
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name])
            && Path::new(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    Some(commit)
}
