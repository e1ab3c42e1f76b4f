//! The lab's real binaries: found in `$BOSUN_LAB_BIN`, or built (once, cached) by
//! `build-binaries.sh` from the upstream Go modules.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{LabError, Result};

/// The binaries the lab runs or hands to nodes.
pub const REQUIRED: [&str; 5] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kubeadm",
    "kubectl",
];

/// Exit status `build-binaries.sh` uses when Go is missing.
const EXIT_GO_MISSING: i32 = 3;

/// A directory holding every binary in [`REQUIRED`].
#[derive(Clone, Debug)]
pub struct BinDir(PathBuf);

impl BinDir {
    /// Accepts `dir` only if every required binary is there and executable.
    pub fn verify(dir: &Path) -> Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        let missing: Vec<String> = REQUIRED
            .iter()
            .filter(|b| {
                std::fs::metadata(dir.join(b))
                    .map(|m| !m.is_file() || m.permissions().mode() & 0o111 == 0)
                    .unwrap_or(true)
            })
            .map(|b| (*b).to_string())
            .collect();
        if missing.is_empty() {
            Ok(Self(dir.to_path_buf()))
        } else {
            Err(LabError::MissingBinaries {
                dir: dir.to_path_buf(),
                missing,
            })
        }
    }

    /// Uses `dir` when given, otherwise runs `build-binaries.sh`, which returns at once when the
    /// binaries are cached and otherwise builds them (tens of minutes on a small machine),
    /// forwarding its progress lines to stderr.
    pub fn ensure(dir: Option<&Path>) -> Result<Self> {
        if let Some(dir) = dir {
            return Self::verify(dir);
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("build-binaries.sh");
        let mut child = Command::new("bash")
            .arg(&script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(LabError::io("running", &script))?;
        let stderr = child.stderr.take().expect("stderr is piped");
        // Forward progress live (a cold build is long) and keep it for the error message.
        let forward = std::thread::spawn(move || {
            let mut kept = Vec::new();
            for line in BufReader::new(stderr)
                .lines()
                .map_while(std::result::Result::ok)
            {
                eprintln!("{line}");
                kept.push(line);
            }
            kept
        });
        let output = child
            .wait_with_output()
            .map_err(LabError::io("waiting for", &script))?;
        let errors = forward.join().unwrap_or_default();
        if output.status.code() == Some(EXIT_GO_MISSING) {
            return Err(LabError::GoMissing);
        }
        if !output.status.success() {
            let log = errors
                .iter()
                .find_map(|l| {
                    l.split("log: ")
                        .nth(1)
                        .or_else(|| l.split("build log (").nth(1))
                })
                .map_or_else(
                    || "(see the output below)".to_string(),
                    |l| l.trim_end_matches("):").to_string(),
                );
            let tail = errors[errors.len().saturating_sub(30)..].join("\n");
            return Err(LabError::Build {
                status: output.status.to_string(),
                log,
                tail,
            });
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let dir = stdout.lines().last().unwrap_or_default().trim();
        Self::verify(Path::new(dir))
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.0
    }

    /// The path of one binary.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// The Kubernetes version the binaries were built at, from `kube-apiserver --version`
    /// (e.g. `v1.34.4`): the one source of truth for kubeadm's pinned `kubernetesVersion`.
    pub fn kubernetes_version(&self) -> Result<String> {
        let out = crate::process::run(Command::new(self.path("kube-apiserver")).arg("--version"))?;
        // "Kubernetes v1.34.4"
        out.split_whitespace()
            .find(|w| w.starts_with('v'))
            .map(str::to_string)
            .ok_or_else(|| LabError::Command {
                command: format!("{} --version", self.path("kube-apiserver").display()),
                status: "exit 0".into(),
                output: format!(
                    "expected `Kubernetes vX.Y.Z`, found {out:?}; rebuild the binaries"
                ),
            })
    }
}
