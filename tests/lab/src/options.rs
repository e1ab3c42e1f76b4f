//! Where the lab lives and what shape it has: state directory, ports, node counts.

use std::path::PathBuf;

use crate::error::{LabError, Result};

/// Default first port: kube-apiserver listens here, etcd and kube-controller-manager on the next
/// three. Away from 6443/2379/2380/10257 so the lab never collides with a real cluster on the host.
pub const DEFAULT_PORT_BASE: u16 = 16443;
/// Default number of simulated nodes.
pub const DEFAULT_NODES: u32 = 4;
/// Default number of control-plane nodes among them.
pub const DEFAULT_CONTROL_PLANES: u32 = 1;

/// How to start (or find) a lab.
#[derive(Clone, Debug)]
pub struct LabOptions {
    /// The one directory holding PKI, kubeconfigs, etcd data, logs, pidfiles and node roots.
    pub state_dir: PathBuf,
    /// A directory with prebuilt binaries; `None` builds (or reuses) them with build-binaries.sh.
    pub bin_dir: Option<PathBuf>,
    /// First of the four loopback ports the lab listens on.
    pub port_base: u16,
    /// Total number of simulated nodes.
    pub nodes: u32,
    /// How many of them are control-plane nodes (listed first).
    pub control_planes: u32,
}

impl LabOptions {
    /// Options from the environment: `BOSUN_LAB_DIR`, `BOSUN_LAB_BIN`, `BOSUN_LAB_PORT_BASE`,
    /// `BOSUN_LAB_NODES`, `BOSUN_LAB_CONTROL_PLANES`, each falling back to its default.
    pub fn from_env() -> Result<Self> {
        Ok(Self {
            state_dir: std::env::var_os("BOSUN_LAB_DIR").map_or_else(
                || cache_dir().join("bosun").join("lab-state"),
                PathBuf::from,
            ),
            bin_dir: std::env::var_os("BOSUN_LAB_BIN")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            port_base: env_number("BOSUN_LAB_PORT_BASE", DEFAULT_PORT_BASE)?,
            nodes: env_number("BOSUN_LAB_NODES", DEFAULT_NODES)?,
            control_planes: env_number("BOSUN_LAB_CONTROL_PLANES", DEFAULT_CONTROL_PLANES)?,
        })
    }

    /// Checks the shape: at least one control plane, no more control planes than nodes, and room
    /// for the four ports below 65536.
    pub fn validate(&self) -> Result<()> {
        if self.control_planes == 0 {
            return Err(LabError::Shape(
                "--control-planes must be at least 1 (the lab's PKI belongs to a control plane)"
                    .into(),
            ));
        }
        if self.control_planes > self.nodes {
            return Err(LabError::Shape(format!(
                "--control-planes {} exceeds --nodes {}: control planes are counted among the nodes",
                self.control_planes, self.nodes
            )));
        }
        if self.control_planes > 249 {
            return Err(LabError::Shape(format!(
                "--control-planes {} is more than the lab's 249 control-plane addresses",
                self.control_planes
            )));
        }
        if self.port_base < 1024 || self.port_base > u16::MAX - 3 {
            return Err(LabError::Shape(format!(
                "--port-base {} must be between 1024 and {} (the lab uses four consecutive ports)",
                self.port_base,
                u16::MAX - 3
            )));
        }
        Ok(())
    }
}

/// The loopback ports of one lab.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ports {
    /// kube-apiserver's secure port.
    pub apiserver: u16,
    /// etcd's client port.
    pub etcd_client: u16,
    /// etcd's peer port (single member, but etcd always listens on one).
    pub etcd_peer: u16,
    /// kube-controller-manager's secure (health and metrics) port.
    pub controller_manager: u16,
}

impl Ports {
    /// The four consecutive ports starting at `base`.
    pub fn from_base(base: u16) -> Self {
        Self {
            apiserver: base,
            etcd_client: base + 1,
            etcd_peer: base + 2,
            controller_manager: base + 3,
        }
    }

    /// Each port with the component that listens on it.
    pub fn all(&self) -> [(u16, &'static str); 4] {
        [
            (self.apiserver, "kube-apiserver"),
            (self.etcd_client, "etcd (client)"),
            (self.etcd_peer, "etcd (peer)"),
            (self.controller_manager, "kube-controller-manager"),
        ]
    }
}

fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    std::env::var_os("HOME").map_or_else(
        || PathBuf::from("/tmp"),
        |home| PathBuf::from(home).join(".cache"),
    )
}

fn env_number<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| LabError::Shape(format!("{name}={v:?} is not a valid number"))),
        _ => Ok(default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(nodes: u32, control_planes: u32, port_base: u16) -> LabOptions {
        LabOptions {
            state_dir: PathBuf::from("/state"),
            bin_dir: None,
            port_base,
            nodes,
            control_planes,
        }
    }

    #[test]
    fn shape_is_validated() {
        assert!(opts(4, 1, DEFAULT_PORT_BASE).validate().is_ok());
        assert!(matches!(
            opts(4, 0, DEFAULT_PORT_BASE).validate(),
            Err(LabError::Shape(_))
        ));
        assert!(matches!(
            opts(2, 3, DEFAULT_PORT_BASE).validate(),
            Err(LabError::Shape(_))
        ));
        assert!(matches!(opts(4, 1, 80).validate(), Err(LabError::Shape(_))));
        assert!(matches!(
            opts(4, 1, u16::MAX - 1).validate(),
            Err(LabError::Shape(_))
        ));
    }

    #[test]
    fn ports_are_consecutive() {
        let p = Ports::from_base(20000);
        assert_eq!(
            (
                p.apiserver,
                p.etcd_client,
                p.etcd_peer,
                p.controller_manager
            ),
            (20000, 20001, 20002, 20003)
        );
    }
}
