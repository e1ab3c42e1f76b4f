//! The host's error type: every way loading or running a plugin can fail.
//!
//! Callers match on the variant: the agent turns them into NodeTask step results, the CLI
//! prints them. After any of them the same [`Host`](crate::Host) keeps working: each run
//! has its own store, and nothing a plugin does survives its run.

use std::time::Duration;

/// Why the host refused or stopped a plugin.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The plugin's bytes or signatures did not pass verification. Nothing was compiled.
    #[error("plugin {name} {version} refused before compiling: {source}")]
    Untrusted {
        name: String,
        version: String,
        #[source]
        source: Box<bosun_trust::TrustError>,
    },

    /// An unsigned plugin was offered but this host was not configured to accept one.
    #[error(
        "refusing to load an unverified plugin: this host was created without \
         `allow_unverified`; sign the plugin and pin its digest instead"
    )]
    UnverifiedRefused,

    /// The component could not be compiled (not a valid component, or not one this
    /// engine accepts).
    #[error("plugin is not a valid WebAssembly component for this host: {message}")]
    Compile { message: String },

    /// The component imports something the host never provides (sockets, wasi:http, or
    /// an interface that is not part of the Bosun ABI).
    #[error(
        "plugin imports `{import}`, which this host does not provide; a plugin may import only \
         {allowed}; rebuild it without that dependency"
    )]
    ForbiddenImport {
        import: String,
        allowed: &'static str,
    },

    /// The plugin was built against another version of the `bosun:plugin` ABI.
    #[error(
        "plugin ABI mismatch: this host serves bosun:plugin@{expected}, the plugin was built \
         for {found}; rebuild it against sdk/wit {expected}"
    )]
    AbiMismatch {
        expected: &'static str,
        found: String,
    },

    /// What the plugin says about itself does not match what was signed.
    #[error("plugin declares {field} `{declared}` but was signed as `{signed}`")]
    MetadataMismatch {
        field: &'static str,
        signed: String,
        declared: String,
    },

    /// A grant names something the host cannot provide safely (bad path, path outside the
    /// host root, malformed command).
    #[error("invalid grant {grant}: {reason}")]
    InvalidGrant { grant: String, reason: String },

    /// The plugin imports a capability that its grants do not give it at all.
    #[error("not granted: {capability}")]
    NotGranted { capability: String },

    /// The caller asked for an action the plugin does not declare.
    #[error("plugin has no action `{action}`; it declares: {available}")]
    UnknownAction { action: String, available: String },

    /// A params schema in the plugin's `describe` is not JSON, not a JSON Schema, or
    /// refers to a file or URL; the plugin is refused at load.
    #[error(
        "plugin declares an invalid params schema for action `{action}`: {message}; the plugin's author must fix `describe`"
    )]
    InvalidParamsSchema { action: String, message: String },

    /// The params are not a JSON document, exceed the host's size cap, or do not match
    /// the action's declared schema.
    #[error("invalid params: {message}")]
    InvalidParams { message: String },

    /// The call ran past its wall-clock deadline and was interrupted.
    #[error("plugin exceeded its deadline of {deadline:?} and was stopped")]
    DeadlineExceeded { deadline: Duration },

    /// The plugin tried to grow its memory (or tables) beyond the host's limit.
    #[error("plugin exceeded its {what} limit of {limit} and was stopped")]
    MemoryLimit { what: &'static str, limit: u64 },

    /// The plugin logged more than the per-run cap.
    #[error("plugin logged more than {limit} bytes and was stopped")]
    LogLimit { limit: u64 },

    /// The plugin's result (outcome, error message or checks) was larger than the cap.
    #[error("plugin returned {found} bytes of results, more than the cap of {limit}")]
    OutputLimit { limit: u64, found: u64 },

    /// The plugin trapped: a panic, `unreachable`, an out-of-bounds access, a stack
    /// overflow. `stderr` holds what it printed before (a panic message), capped.
    #[error("plugin trapped: {message}{}", if stderr.is_empty() { String::new() } else { format!(" (stderr: {})", stderr.trim_end()) })]
    GuestTrap { message: String, stderr: String },

    /// The instance could not be created (for example the pooling allocator is full).
    #[error("could not instantiate plugin: {message}")]
    Instantiate { message: String },

    /// Setting up the host itself failed (engine config, cache directory, host root).
    #[error("host setup failed: {message}")]
    Setup { message: String },
}

impl Error {
    pub(crate) fn setup(message: impl std::fmt::Display) -> Self {
        Error::Setup {
            message: message.to_string(),
        }
    }
}
