//! The errors the controller and the agent share.

use std::time::Duration;

use bosun_planner::state::TransitionError;

/// An API call that failed, a state transition the state machine refuses, or a decision
/// that cannot be made yet because the policies are not listed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed; `what` names the call so the log says which object and why.
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// A state transition the state machine refuses (a bug, or a person edited a status by
    /// hand).
    #[error("NodeTask {task}: {source}")]
    Transition {
        task: String,
        #[source]
        source: TransitionError,
    },
    /// The policy gates cannot decide: nothing runs while they cannot.
    #[error(
        "the cluster's Policy objects have not been listed yet (waited {waited:?}); no step or Operation proceeds until they are, so a policy is never skipped: check that the Policy CRD is installed and this process may list policies.bosun.dev"
    )]
    NotSynced { waited: Duration },
    /// The Policy watch does not show what a quorum read lists, even after it was opened
    /// again: no decision is made on an old set of policies.
    #[error(
        "this process's Policy watch is behind the API server: it does not show {} as the API server lists them, {waited:?} after it was opened again; no step or Operation proceeds on an older set of policies, and this is tried again",
        objects.join(", ")
    )]
    PoliciesBehind {
        objects: Vec<String>,
        waited: Duration,
    },
}

impl Error {
    /// For `map_err`: an API error of the call `what` (say which object, and what for).
    pub fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Kube { what, source }
    }

    /// For `map_err`: a transition of NodeTask `task` the state machine refused.
    pub fn transition(task: impl Into<String>) -> impl FnOnce(TransitionError) -> Error {
        let task = task.into();
        move |source| Error::Transition { task, source }
    }
}

/// Short for `Result<T, Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
