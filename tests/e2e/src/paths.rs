//! Where things are: the workspace, its target directory, and its built binaries.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the workspace root exists")
}

/// `$CARGO_TARGET_DIR`, or the workspace's `target/`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

/// The source files cargo recorded as inputs of a built binary (its dep-info file,
/// `<binary>.d`: `target: dep dep ...`, spaces in paths escaped as `\ `).
fn dep_info_sources(binary: &Path) -> Result<Vec<PathBuf>> {
    let dep_info = binary.with_extension("d");
    let text = std::fs::read_to_string(&dep_info)
        .with_context(|| format!("reading {} (cargo writes it next to the binary)", dep_info.display()))?;
    let line = text.lines().next().unwrap_or_default();
    let (_, deps) = line.split_once(": ").with_context(|| format!("{} has no `target: deps` line", dep_info.display()))?;
    let mut out = Vec::new();
    let mut current = String::new();
    let mut chars = deps.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&' ') => current.push(chars.next().unwrap_or(' ')),
            ' ' => {
                if !current.is_empty() {
                    out.push(PathBuf::from(std::mem::take(&mut current)));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        out.push(PathBuf::from(current));
    }
    Ok(out)
}

/// A workspace binary in `$CARGO_TARGET_DIR/debug`, refused when missing or when any
/// workspace source file it was built from (as cargo's dep-info lists them) changed since:
/// a test of stale code proves nothing.
///
/// The binary is not built here: a nested `cargo build` would wait forever on the lock
/// held by the `cargo test` running the test. `cargo test --workspace` builds the
/// binaries of every crate with integration tests first; alone, run
/// `cargo build -p bosun-controller -p bosun-agent` before the e2e test.
pub fn binary(name: &str) -> Result<PathBuf> {
    let path = target_dir().join("debug").join(name);
    let hint = "build it first: `cargo build -p bosun-controller -p bosun-agent` (cargo test --workspace does this)";
    let built = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .with_context(|| format!("{} not found; {hint}", path.display()))?;
    let root = workspace_root();
    for source in dep_info_sources(&path)? {
        if !source.starts_with(&root) {
            continue; // registry crates do not change under a built binary
        }
        // A source that vanished was renamed or removed: the binary is stale too.
        let changed = std::fs::metadata(&source).and_then(|m| m.modified()).map_or(true, |t| t > built);
        ensure!(!changed, "{} is older than {}; {hint}", path.display(), source.display());
    }
    Ok(path)
}

/// Builds a plugin package for wasm32-wasip2 in its own target directory
/// (`$CARGO_TARGET_DIR/cli-test-plugins`, shared with the CLI tests, so it is usually
/// already built; a separate directory, so the nested cargo does not wait on the lock of
/// the running `cargo test`) and returns the component's bytes.
///
/// `package` is the cargo package (`bosun-plugin-hello`); the artifact name is derived from it.
pub fn build_plugin(package: &str) -> Result<Vec<u8>> {
    let dir = target_dir().join("cli-test-plugins");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(workspace_root())
        .env("CARGO_TARGET_DIR", &dir)
        .args(["build", "--release", "--target", "wasm32-wasip2", "-p", package])
        .status()
        .with_context(|| format!("running cargo to build the {package} plugin"))?;
    ensure!(
        status.success(),
        "building the {package} plugin for wasm32-wasip2 failed; is `rustup target add wasm32-wasip2` done?"
    );
    let path = dir.join("wasm32-wasip2/release").join(format!("{}.wasm", package.replace('-', "_")));
    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
}
