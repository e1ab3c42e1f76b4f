//! The lab's error type: every variant says what was expected, what was found and what to do.

use std::path::PathBuf;

/// Everything that can go wrong while starting, inspecting or stopping the lab.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The binaries are missing and cannot be built because there is no Go toolchain.
    #[error(
        "Go is not installed or not on PATH, and the lab's binaries are not built yet: the lab \
         builds etcd and Kubernetes from the upstream Go modules. Install Go 1.24 or newer, or set \
         BOSUN_LAB_BIN to a directory holding {}",
        crate::binaries::REQUIRED.join(", ")
    )]
    GoMissing,

    /// `build-binaries.sh` failed.
    #[error(
        "building the lab's binaries failed ({status}); see the build log {log}. Its output ended with:\n{tail}"
    )]
    Build {
        status: String,
        log: String,
        tail: String,
    },

    /// A bin directory (usually `$BOSUN_LAB_BIN`) lacks some binaries.
    #[error(
        "the lab's bin directory {dir} lacks {missing:?}; expected {} there. Unset BOSUN_LAB_BIN to \
         build them, or run tests/lab/build-binaries.sh and point BOSUN_LAB_BIN at the directory it prints",
        crate::binaries::REQUIRED.join(", ")
    )]
    MissingBinaries { dir: PathBuf, missing: Vec<String> },

    /// A port the lab needs is held by another process.
    #[error(
        "port {port} on 127.0.0.1 is needed for the lab's {component} but another process is \
         listening on it (see `ss -ltnp 'sport = :{port}'`). Stop that process, or move the lab's \
         ports with `lab up --port-base N` / BOSUN_LAB_PORT_BASE=N (the lab uses N..N+3)"
    )]
    PortTaken { port: u16, component: &'static str },

    /// An external command (kubeadm, kill, ...) failed.
    #[error("`{command}` failed ({status}): {output}")]
    Command {
        command: String,
        status: String,
        output: String,
    },

    /// A control-plane process exited while the lab was waiting for it.
    #[error("{component} exited during start-up; the last lines of its log {log}:\n{tail}")]
    ProcessDied {
        component: &'static str,
        log: PathBuf,
        tail: String,
    },

    /// The API server did not answer `/readyz` with `ok` in time.
    #[error(
        "kube-apiserver did not become ready within {seconds}s (last answer: {last}); see its log {log}"
    )]
    NotReady {
        seconds: u64,
        last: String,
        log: PathBuf,
    },

    /// The requested lab shape is impossible.
    #[error("invalid lab shape: {0}")]
    Shape(String),

    /// A request the lab refuses (bad fleet prefix or count); the message says what to do.
    #[error("{0}")]
    Invalid(String),

    /// The lab's state directory was created with other ports than requested.
    #[error(
        "the lab in {dir} was created with port base {running}, not {requested}; use that port \
         base, or run `lab down --purge` to recreate the lab on the new ports"
    )]
    PortsDiffer {
        dir: PathBuf,
        running: u16,
        requested: u16,
    },

    /// An operation that needs a running lab found none.
    #[error(
        "the lab in {dir} is not running; start it with `lab up` (or `cargo run -p bosun-lab -- up`)"
    )]
    NotRunning { dir: PathBuf },

    /// A file operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The lab's state file is corrupt.
    #[error(
        "the lab's state file {path} is unreadable ({source}); run `lab down --purge` to start over"
    )]
    State {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    /// A kubeconfig the lab wrote cannot be loaded.
    #[error("loading the kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },

    /// The API server refused or failed a request.
    #[error("Kubernetes API request failed while {action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
}

impl LabError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io {
            action,
            path,
            source,
        }
    }

    pub(crate) fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let action = action.into();
        move |source| Self::Kube { action, source }
    }
}

/// Result alias for the lab.
pub type Result<T, E = LabError> = std::result::Result<T, E>;
