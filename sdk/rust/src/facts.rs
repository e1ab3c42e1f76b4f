//! Facts about the node, read by the host from the node's host root. Facts need no grant.

use crate::HostError;
use crate::bindings::bosun::plugin::facts as wit;

/// The parts of `/etc/os-release` plugins branch on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OsRelease {
    /// `ID`: `debian`, `ubuntu`, `rhel`, ...
    pub id: String,
    /// `ID_LIKE`, split on spaces.
    pub id_like: Vec<String>,
    /// `VERSION_ID`.
    pub version_id: String,
    /// `PRETTY_NAME`.
    pub pretty_name: String,
}

impl OsRelease {
    /// True when `ID` or any `ID_LIKE` entry equals `family` (for example `debian` on Ubuntu).
    #[must_use]
    pub fn is_like(&self, family: &str) -> bool {
        self.id == family || self.id_like.iter().any(|l| l == family)
    }
}

/// Facts of the node the plugin runs on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    /// Kubernetes Node name.
    pub node_name: String,
    /// `control-plane`, `worker`.
    pub roles: Vec<String>,
    /// From `/etc/os-release`.
    pub os: OsRelease,
    /// `amd64`, `arm64`, ...
    pub arch: String,
    /// Kernel release.
    pub kernel: String,
    /// kubelet version, if known.
    pub kubelet_version: Option<String>,
    /// kubeadm version, if present.
    pub kubeadm_version: Option<String>,
}

impl NodeFacts {
    /// True when the node has the `control-plane` role.
    #[must_use]
    pub fn is_control_plane(&self) -> bool {
        self.roles.iter().any(|r| r == "control-plane")
    }
}

/// The facts of this node.
///
/// # Errors
/// A host error when the host could not read them (for example no os-release in the host root).
pub fn node() -> Result<NodeFacts, HostError> {
    let f = wit::node().map_err(HostError::from)?;
    Ok(NodeFacts {
        node_name: f.node_name,
        roles: f.roles,
        os: OsRelease {
            id: f.os.id,
            id_like: f.os.id_like,
            version_id: f.os.version_id,
            pretty_name: f.os.pretty_name,
        },
        arch: f.arch,
        kernel: f.kernel,
        kubelet_version: f.kubelet_version,
        kubeadm_version: f.kubeadm_version,
    })
}
