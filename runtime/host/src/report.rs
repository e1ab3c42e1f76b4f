//! What a plugin call returns to the caller: the plugin's own answer plus everything
//! the host captured (log lines, progress, refused host calls, stderr).

use crate::error::Error;

/// Severity of a plugin log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

/// One line a plugin logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    pub level: LogLevel,
    pub message: String,
    pub fields: Vec<(String, String)>,
    /// The message was cut at the host's line limit.
    pub truncated: bool,
}

/// The last progress a plugin reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    pub done: u64,
    pub total: u64,
    pub message: String,
}

/// A host call the grants refused (also returned to the plugin as `not-granted`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    /// `exec`, `service`, `http`.
    pub capability: String,
    /// The message the plugin received; names the command, unit or host.
    pub message: String,
}

/// Everything the host captured during one call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Captured {
    pub lines: Vec<LogLine>,
    pub progress: Option<Progress>,
    pub denied: Vec<Denial>,
    /// What the guest wrote to stderr (a panic message, typically), capped.
    pub stderr: String,
    /// Wall time the call spent inside granted host commands and service actions: the
    /// node's own work (kubeadm, the package manager, systemd), as opposed to Bosun's
    /// (compiling, instantiating and running the plugin, checking its grants).
    pub host_time: std::time::Duration,
    /// The grants the call exercised (what `kubectl bosun plugin test` checks every grant
    /// against): host calls a grant admitted, and path operations inside a filesystem grant.
    pub used: std::collections::BTreeSet<GrantUse>,
    /// Bytes of the guest's linear memories at the end of the call: their peak, since
    /// WebAssembly memories only grow. Compare with the host's `max_memory_bytes`.
    pub memory_bytes: u64,
}

/// One grant a call exercised. Indexes are positions in the call's [`Grants`] lists.
///
/// [`Grants`]: bosun_api::grants::Grants
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GrantUse {
    /// A path operation (open, stat, create, remove, rename, list ...) beneath the
    /// filesystem grant with this path. What granted commands read or write there is the
    /// kernel's to enforce and is not seen here.
    Filesystem(String),
    /// A command `exec[grant]` admitted, by its argument pattern `pattern` (`None` when the
    /// grant lists no patterns and the command ran without arguments).
    Exec {
        grant: usize,
        pattern: Option<usize>,
    },
    /// A service call the grant for `unit` admitted: `start`, `stop`, `restart`, `reload`
    /// or `status`.
    Service { unit: String, action: String },
    /// A GET `http[grant]` admitted.
    Http { grant: usize },
}

/// What the plugin says it is (from `describe`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    pub name: String,
    pub version: String,
    pub abi_version: String,
    pub description: String,
    pub actions: Vec<ActionInfo>,
    pub capabilities: Capabilities,
}

/// One action a plugin declares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActionInfo {
    pub name: String,
    pub description: String,
    pub params_schema: String,
    pub idempotent: bool,
}

/// The capabilities a plugin requests (compare with its grants).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// (path, writable)
    pub filesystem: Vec<(String, bool)>,
    /// (command, argument patterns)
    pub exec: Vec<(String, Vec<String>)>,
    /// (unit, actions)
    pub services: Vec<(String, Vec<String>)>,
    pub http: Vec<String>,
}

/// A successful `run`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub changed: bool,
    pub message: String,
    pub outputs: Vec<(String, String)>,
}

/// The error a plugin itself returned from `preflight` or `run`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("plugin error {code}: {message}")]
pub struct PluginError {
    pub code: String,
    pub message: String,
    pub retryable: bool,
}

/// Result of one preflight check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckStatus {
    Pass,
    Warn,
    Fail,
}

/// One preflight check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub name: String,
    pub status: CheckStatus,
    pub message: String,
}

/// A call that ran to completion: the plugin answered (successfully or with its own
/// error) within every limit.
#[derive(Clone, Debug)]
pub struct Report<T> {
    pub result: Result<T, PluginError>,
    pub captured: Captured,
}

/// A `run` that completed.
pub type RunReport = Report<Outcome>;
/// A `preflight` that completed.
pub type PreflightReport = Report<Vec<Check>>;

/// A call the host refused or stopped, with whatever was captured before.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct CallFailure {
    #[source]
    pub error: Error,
    pub captured: Box<Captured>,
}

impl From<Error> for CallFailure {
    fn from(error: Error) -> Self {
        CallFailure {
            error,
            captured: Box::default(),
        }
    }
}
