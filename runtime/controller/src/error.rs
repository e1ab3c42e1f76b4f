//! The controller's one error type.

use bosun_planner::state::TransitionError;

/// Everything a reconcile can fail with. Planning errors are not here: an Operation that
/// cannot be planned is a user error and goes to its status (phase Failed), not a retry.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed; `what` names the call so the log says which object and why.
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// A state transition the state machine refuses (a controller bug, or a person edited
    /// a status by hand).
    #[error("NodeTask {task}: {source}")]
    Transition {
        task: String,
        #[source]
        source: TransitionError,
    },
    /// A value could not be turned into JSON for a patch.
    #[error("serializing {what}: {source}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    pub(crate) fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Kube { what, source }
    }
}

/// Short for `Result<T, Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
