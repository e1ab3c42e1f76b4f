//! The two error types a plugin deals with: [`HostError`] (a host call was refused or
//! failed) and [`PluginError`] (what an action returns to the agent).

use std::fmt;

use crate::bindings::bosun::plugin::types::HostError as WitHostError;

/// Why a host call was refused or failed, as reported by the Bosun host. The message says
/// what was expected and what was found; for [`HostError::NotGranted`] it names the
/// capability to add to the plugin's grants.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// The capability is not in this plugin's grants.
    #[error("not granted: {0}")]
    NotGranted(String),
    /// An argument was malformed or exceeded a host limit.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The host operation did not finish within its timeout.
    #[error("timed out: {0}")]
    Timeout(String),
    /// The result exceeded a size cap.
    #[error("too large: {0}")]
    TooLarge(String),
    /// The operation was allowed but failed on the host.
    #[error("failed: {0}")]
    Failed(String),
}

impl HostError {
    /// The stable `plugin-error` code this error maps to when returned from an action.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Self::NotGranted(_) => "not-granted",
            Self::InvalidArgument(_) => "invalid-argument",
            Self::Timeout(_) => "host-timeout",
            Self::TooLarge(_) => "too-large",
            Self::Failed(_) => "host-failed",
        }
    }
}

impl From<WitHostError> for HostError {
    fn from(e: WitHostError) -> Self {
        match e {
            WitHostError::NotGranted(m) => Self::NotGranted(m),
            WitHostError::InvalidArgument(m) => Self::InvalidArgument(m),
            WitHostError::Timeout(m) => Self::Timeout(m),
            WitHostError::TooLarge(m) => Self::TooLarge(m),
            WitHostError::Failed(m) => Self::Failed(m),
        }
    }
}

/// Why an action failed: a stable machine-readable `code` (kebab-case, for example
/// `kubeadm-missing`), a message that says what went wrong and what to do, and whether
/// the same step may succeed if tried again unchanged.
///
/// Every error type of this SDK converts into it with `?`, keeping its own code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginError {
    /// Stable, machine-readable code.
    pub code: String,
    /// What went wrong and what to do about it.
    pub message: String,
    /// True when retrying the unchanged step may succeed.
    pub retryable: bool,
}

impl PluginError {
    /// A non-retryable error.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
            retryable: false,
        }
    }

    /// A retryable error: the same step may succeed if tried again unchanged.
    pub fn retryable(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            retryable: true,
            ..Self::new(code, message)
        }
    }

    /// Same error with a context prefix on the message, for example the file being read.
    #[must_use]
    pub fn context(mut self, context: impl fmt::Display) -> Self {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

impl fmt::Display for PluginError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)?;
        if self.retryable {
            f.write_str(" (retryable)")?;
        }
        Ok(())
    }
}

impl std::error::Error for PluginError {}

impl From<HostError> for PluginError {
    fn from(e: HostError) -> Self {
        let retryable = matches!(e, HostError::Timeout(_));
        Self {
            code: e.code().to_owned(),
            message: e.to_string(),
            retryable,
        }
    }
}
