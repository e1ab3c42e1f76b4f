//! Errors of the policy crate, and the source location carried by a compile error.

use std::fmt;

use serde::Serialize;

/// Why one policy did not compile. Carried in the policy's status and, because a broken
/// policy fails closed, in the message of every decision it takes part in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CompileError {
    /// The policy's name (the `Policy` resource's name, or the file stem in tests).
    pub policy: String,
    /// 1-based line in the policy's Rego source, when the engine reported one.
    pub line: Option<u32>,
    /// 1-based column in that line, when the engine reported one.
    pub column: Option<u32>,
    /// What went wrong, without the source excerpt.
    pub message: String,
}

impl CompileError {
    pub(crate) fn new(policy: &str, message: impl Into<String>) -> Self {
        CompileError {
            policy: policy.to_owned(),
            line: None,
            column: None,
            message: message.into(),
        }
    }

    /// Builds a compile error from regorus' message, which looks like
    /// `\n--> FILE:LINE:COL\n  |\n3 | source line\n  |   ^\nerror: MESSAGE`.
    pub(crate) fn from_engine(policy: &str, err: &anyhow::Error) -> Self {
        let text = format!("{err:#}");
        let location = text.lines().find_map(|l| {
            let rest = l.trim().strip_prefix("--> ")?;
            let mut parts = rest.rsplitn(3, ':');
            let col = parts.next()?.trim().parse::<u32>().ok()?;
            let line = parts.next()?.trim().parse::<u32>().ok()?;
            Some((line, col))
        });
        let message = text
            .lines()
            .rev()
            .find_map(|l| l.trim().strip_prefix("error: "))
            .map_or_else(|| text.trim().to_owned(), str::to_owned);
        CompileError {
            policy: policy.to_owned(),
            line: location.map(|(l, _)| l),
            column: location.map(|(_, c)| c),
            message,
        }
    }
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "{}:{l}:{c}: {}", self.policy, self.message),
            (Some(l), None) => write!(f, "{}:{l}: {}", self.policy, self.message),
            _ => write!(f, "{}: {}", self.policy, self.message),
        }
    }
}

/// Errors of [`crate::explain`] and [`crate::test_dir`] that are not a policy's fault.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A data, input or cases file is not what it should be.
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
    /// The query names no decision point.
    #[error(
        "unknown decision point {found:?}: expected one of operation, step, capabilities (or data.bosun.<point>.deny)"
    )]
    UnknownPoint { found: String },
}
