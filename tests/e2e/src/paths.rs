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
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

/// The dep-info file (`target: dep dep ...`) of the compilation that produced `binary`.
///
/// rustc writes one next to every artifact it builds in `deps/` (`<crate>-<hash>.d`), for
/// `cargo build` and `cargo test` alike; cargo then hard-links the artifact up to
/// `debug/<name>`. The binary's own is found by that shared inode. `debug/<name>.d` is only
/// a fallback: cargo writes it for `cargo build` alone and does not refresh it when a
/// `cargo test` rebuilds the binary, so it may describe an older build.
fn dep_info_of(binary: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let meta =
        std::fs::metadata(binary).with_context(|| format!("reading {}", binary.display()))?;
    let stem = binary
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("{} has no UTF-8 file name", binary.display()))?
        .replace('-', "_");
    let deps = binary.with_file_name("deps");
    let prefix = format!("{stem}-");
    if let Ok(entries) = std::fs::read_dir(&deps) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(hash) = name.strip_prefix(&prefix) else {
                continue;
            };
            if hash.contains('.') {
                continue; // the `.d`, `.rlib`, ... files beside the artifacts
            }
            let same = entry
                .metadata()
                .is_ok_and(|m| m.dev() == meta.dev() && m.ino() == meta.ino());
            let dep_info = entry.path().with_extension("d");
            if same && dep_info.is_file() {
                return Ok(dep_info);
            }
        }
    }
    let uplifted = binary.with_extension("d");
    ensure!(
        uplifted.is_file(),
        "found no dep-info for {} (neither a {}/{prefix}<hash>.d with the same inode nor {})",
        binary.display(),
        deps.display(),
        uplifted.display()
    );
    Ok(uplifted)
}

/// The source files rustc recorded as inputs of a built binary (its dep-info file:
/// `target: dep dep ...`, spaces in paths escaped as `\ `).
fn dep_info_sources(binary: &Path) -> Result<Vec<PathBuf>> {
    let dep_info = dep_info_of(binary)?;
    let text = std::fs::read_to_string(&dep_info)
        .with_context(|| format!("reading {}", dep_info.display()))?;
    let line = text.lines().next().unwrap_or_default();
    let (_, deps) = line
        .split_once(": ")
        .with_context(|| format!("{} has no `target: deps` line", dep_info.display()))?;
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
/// workspace source file it was built from (as rustc's dep-info lists them) changed since:
/// a test of stale code proves nothing.
///
/// The binary is not built here: a nested `cargo build` would wait forever on the lock
/// held by the `cargo test` running the test. `cargo test --workspace` (and so
/// `tests/run.sh`) builds the binaries of every crate with integration tests first; alone,
/// run `cargo build -p bosun-controller -p bosun-agent -p kubectl-bosun` before the e2e test.
pub fn binary(name: &str) -> Result<PathBuf> {
    binary_of("debug", name)
}

/// [`binary`] of the Cargo profile directory `profile` (`debug`, `release`): the bench built
/// with `--release` runs the release controller and agent beside it.
pub fn binary_of(profile: &str, name: &str) -> Result<PathBuf> {
    let path = target_dir().join(profile).join(name);
    ensure_fresh(&path, &workspace_root())?;
    Ok(path)
}

/// Refuses `binary` when it is missing or older than any source under `root` that its
/// dep-info names. Relative dep-info paths are relative to `root`: cargo runs rustc from the
/// workspace root and names member crates' sources that way.
fn ensure_fresh(binary: &Path, root: &Path) -> Result<()> {
    let hint = "build it first: `cargo build -p bosun-controller -p bosun-agent -p kubectl-bosun` \
                (tests/run.sh does this)";
    let built = std::fs::metadata(binary)
        .and_then(|m| m.modified())
        .with_context(|| format!("{} not found; {hint}", binary.display()))?;
    for source in dep_info_sources(binary)? {
        let source = root.join(source); // an absolute path stays as it is
        if !source.starts_with(root) {
            continue; // registry crates do not change under a built binary
        }
        // A source that vanished was renamed or removed: the binary is stale too.
        let changed = std::fs::metadata(&source)
            .and_then(|m| m.modified())
            .map_or(true, |t| t > built);
        ensure!(
            !changed,
            "{} is older than {}; {hint}",
            binary.display(),
            source.display()
        );
    }
    Ok(())
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
        .args([
            "build",
            "--release",
            "--target",
            "wasm32-wasip2",
            "-p",
            package,
        ])
        .status()
        .with_context(|| format!("running cargo to build the {package} plugin"))?;
    ensure!(
        status.success(),
        "building the {package} plugin for wasm32-wasip2 failed; is `rustup target add wasm32-wasip2` done?"
    );
    let path = dir
        .join("wasm32-wasip2/release")
        .join(format!("{}.wasm", package.replace('-', "_")));
    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))
}

/// Runs one of the cached Go tool builds under `tests/lab/` (`build-registry.sh`,
/// `build-helm.sh`: a no-op once built) and returns the bin directory it prints as its last
/// line.
pub fn go_tool_dir(script: &str) -> Result<PathBuf> {
    let path = workspace_root().join("tests/lab").join(script);
    let out = Command::new("bash")
        .arg(&path)
        .output()
        .with_context(|| format!("running {}", path.display()))?;
    ensure!(
        out.status.success(),
        "{} failed: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout)?;
    let bin = stdout
        .lines()
        .last()
        .with_context(|| format!("{script} printed no bin directory"))?;
    Ok(PathBuf::from(bin.trim()))
}

#[cfg(test)]
mod tests {
    use std::fs::{self, File};
    use std::time::{Duration, SystemTime};

    use super::*;

    /// A target directory as `cargo test` leaves it: the binary hard-linked from `deps/`,
    /// rustc's dep-info beside it naming the source relative to the workspace root, no
    /// `debug/<name>.d`, and a decoy (the crate's unit-test binary) with its own dep-info.
    fn layout(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let root = dir.join("ws");
        let deps = dir.join("target/debug/deps");
        fs::create_dir_all(root.join("src")).unwrap();
        fs::create_dir_all(&deps).unwrap();
        let source = root.join("src/main.rs");
        fs::write(&source, "fn main() {}").unwrap();
        let old = SystemTime::now() - Duration::from_secs(3600);
        File::options()
            .write(true)
            .open(&source)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let artifact = deps.join("my_tool-1111");
        fs::write(&artifact, "binary").unwrap();
        fs::write(
            deps.join("my_tool-1111.d"),
            format!("{}.d: src/main.rs\n\nsrc/main.rs:\n", artifact.display()),
        )
        .unwrap();
        fs::write(deps.join("my_tool-2222"), "unit tests").unwrap();
        fs::write(deps.join("my_tool-2222.d"), "x: src/other.rs\n").unwrap();
        let binary = dir.join("target/debug/my-tool");
        fs::hard_link(&artifact, &binary).unwrap();
        (root, binary, source)
    }

    #[test]
    fn a_binary_built_by_cargo_test_is_checked_against_its_own_relative_dep_info() {
        let dir = tempfile::tempdir().unwrap();
        let (root, binary, source) = layout(dir.path());
        assert_eq!(
            dep_info_of(&binary).unwrap(),
            binary.with_file_name("deps/my_tool-1111.d")
        );
        ensure_fresh(&binary, &root).unwrap();

        // Editing the source after the build makes the binary stale.
        let later = SystemTime::now() + Duration::from_secs(60);
        File::options()
            .write(true)
            .open(&source)
            .unwrap()
            .set_modified(later)
            .unwrap();
        let err = ensure_fresh(&binary, &root).unwrap_err().to_string();
        assert!(
            err.contains("is older than") && err.contains("src/main.rs"),
            "{err}"
        );
    }

    #[test]
    fn a_binary_whose_source_vanished_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let (root, binary, source) = layout(dir.path());
        fs::remove_file(&source).unwrap();
        let err = ensure_fresh(&binary, &root).unwrap_err().to_string();
        assert!(err.contains("is older than"), "{err}");
    }

    #[test]
    fn a_binary_without_any_dep_info_is_refused_with_what_was_looked_for() {
        let dir = tempfile::tempdir().unwrap();
        let (root, binary, _) = layout(dir.path());
        fs::remove_file(binary.with_file_name("deps/my_tool-1111.d")).unwrap();
        let err = ensure_fresh(&binary, &root).unwrap_err().to_string();
        assert!(
            err.contains("found no dep-info") && err.contains("my_tool-<hash>.d"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_binary_says_how_to_build_it() {
        let dir = tempfile::tempdir().unwrap();
        let err = ensure_fresh(&dir.path().join("nope"), dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("not found") && err.contains("cargo build"),
            "{err}"
        );
    }
}
