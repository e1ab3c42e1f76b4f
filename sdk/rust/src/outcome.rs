//! What actions return: [`Outcome`] for `run`, [`Check`]s for `preflight`, and the
//! [`RunContext`] the agent passes in.

use crate::bindings::exports::bosun::plugin::plugin as wit;

/// How the agent wants an action run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunContext {
    /// When true the plugin must not change the node: describe what would change in the
    /// outcome message and return `changed: false`.
    pub dry_run: bool,
    /// True when the previous attempt of this same step on this node was interrupted: the
    /// agent started the plugin for it and no result of it was ever recorded (the agent was
    /// killed or restarted during it), so it may have stopped anywhere part-way through the
    /// change. The agent re-runs an interrupted idempotent action on its own with this set
    /// (and sets it when a person retries an interrupted non-idempotent one). False on a
    /// first attempt and on a retry after a recorded failure. A plugin that would report
    /// "already done" from state the interrupted attempt may have left at the target while
    /// later parts of the change are undone should run the change again.
    pub resumed: bool,
}

impl RunContext {
    /// A context with the given dry-run flag, not resumed (for unit tests of plugin code).
    #[must_use]
    pub fn new(dry_run: bool) -> Self {
        Self {
            dry_run,
            resumed: false,
        }
    }

    /// The same context with [`resumed`](RunContext::resumed) set to `resumed` (for unit
    /// tests of plugin code).
    #[must_use]
    pub fn with_resumed(self, resumed: bool) -> Self {
        Self { resumed, ..self }
    }
}

impl From<wit::RunContext> for RunContext {
    fn from(c: wit::RunContext) -> Self {
        Self {
            dry_run: c.dry_run,
            resumed: c.resumed,
        }
    }
}

/// What a successful `run` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// True when the action changed the node.
    pub changed: bool,
    /// One line for status.
    pub message: String,
    /// Named results, in insertion order.
    pub outputs: Vec<(String, String)>,
}

impl Outcome {
    /// The action changed the node.
    pub fn changed(message: impl Into<String>) -> Self {
        Self {
            changed: true,
            message: message.into(),
            outputs: Vec::new(),
        }
    }

    /// The node was already as wanted (or this was a dry run): nothing changed.
    pub fn unchanged(message: impl Into<String>) -> Self {
        Self {
            changed: false,
            message: message.into(),
            outputs: Vec::new(),
        }
    }

    /// Adds a named output.
    #[must_use]
    pub fn output(mut self, key: impl Into<String>, value: impl ToString) -> Self {
        self.outputs.push((key.into(), value.to_string()));
        self
    }

    pub(crate) fn into_wit(self) -> wit::Outcome {
        wit::Outcome {
            changed: self.changed,
            message: self.message,
            outputs: self.outputs,
        }
    }
}

/// Result of one preflight check.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckStatus {
    /// The condition holds.
    Pass,
    /// Worth a look, but does not stop the step.
    Warn,
    /// Stops the step before `run`.
    Fail,
}

/// One preflight check and its result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    /// Short, stable name, for example `os-release-readable`.
    pub name: String,
    /// The result.
    pub status: CheckStatus,
    /// What was checked and found.
    pub message: String,
}

impl Check {
    /// A passing check.
    pub fn pass(name: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            status: CheckStatus::Pass,
            message: message.into(),
        }
    }

    /// A warning.
    pub fn warn(name: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            status: CheckStatus::Warn,
            message: message.into(),
        }
    }

    /// A failing check: the step will not run.
    pub fn fail(name: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            status: CheckStatus::Fail,
            message: message.into(),
        }
    }

    /// `pass` when `ok`, otherwise `fail`, with the same message.
    pub fn require(name: impl Into<String>, ok: bool, message: impl Into<String>) -> Self {
        if ok {
            Self::pass(name, message)
        } else {
            Self::fail(name, message)
        }
    }

    pub(crate) fn into_wit(self) -> wit::Check {
        wit::Check {
            name: self.name,
            status: match self.status {
                CheckStatus::Pass => wit::CheckStatus::Pass,
                CheckStatus::Warn => wit::CheckStatus::Warn,
                CheckStatus::Fail => wit::CheckStatus::Fail,
            },
            message: self.message,
        }
    }
}
