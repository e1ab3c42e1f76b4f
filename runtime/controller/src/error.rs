//! The controller's one error type.

/// Everything a reconcile can fail with. Planning errors are not here: an Operation that
/// cannot be planned is a user error and goes to its status (phase Failed), not a retry.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed, a state transition was refused (a controller bug, or a person
    /// edited a status by hand), or the policies are not listed yet.
    #[error(transparent)]
    Cluster(#[from] bosun_cluster::Error),
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
        let f = bosun_cluster::Error::kube(what);
        move |source| Error::Cluster(f(source))
    }
}

/// Short for `Result<T, Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
