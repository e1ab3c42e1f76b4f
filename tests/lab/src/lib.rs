//! The Bosun lab: a real control plane on loopback, with simulated kubeadm nodes.
//!
//! The lab runs the real etcd, kube-apiserver and kube-controller-manager (built from the
//! upstream Go modules by `build-binaries.sh`, cached) on 127.0.0.1, with PKI and kubeconfigs
//! made by the real kubeadm. Nodes are simulated: each is a Node object kept Ready through the
//! status subresource (no kubelet runs) plus a host root directory holding what a kubeadm node
//! holds (os-release, /usr/bin/kubeadm, and on control planes the PKI, kubeconfigs and static
//! pod manifests kubeadm wrote there).
//!
//! Everything lives in one state directory (`$BOSUN_LAB_DIR`, default
//! `~/.cache/bosun/lab-state`): `kubeadm.yaml`, `pki/`, `kubeconfig/`, `etcd/`, `logs/`,
//! `run/*.pid`, `nodes/<name>/` and `state.json`.
//!
//! End-to-end tests call [`ensure_lab`], which starts the lab or reuses a running one:
//!
//! ```no_run
//! # async fn demo() -> Result<(), bosun_lab::LabError> {
//! let lab = bosun_lab::ensure_lab().await?;
//! let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(lab.client.clone());
//! # Ok(()) }
//! ```

pub mod binaries;
mod error;
pub mod fleet;
pub mod kubeadm;
mod lab;
pub mod nodes;
mod options;
pub mod process;

pub use error::{LabError, Result};
pub use fleet::{FLEET_LABEL, add_fleet_nodes, remove_fleet_nodes};
pub use lab::{
    DaemonStatus, LabHandle, LabPaths, LabState, LabStatus, client, down, ensure_lab,
    restart_apiserver, running, status, up,
};
pub use nodes::{LabNode, Role};
pub use options::{DEFAULT_CONTROL_PLANES, DEFAULT_NODES, DEFAULT_PORT_BASE, LabOptions, Ports};

/// The real-node cluster lab's script (`lab cluster ...`): `$BOSUN_CLUSTER_SCRIPT`, or
/// `tests/cluster/cluster.sh` of the checkout this binary was built from.
pub fn cluster_script() -> std::path::PathBuf {
    match std::env::var_os("BOSUN_CLUSTER_SCRIPT") {
        Some(path) if !path.is_empty() => path.into(),
        _ => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../cluster/cluster.sh"),
    }
}
