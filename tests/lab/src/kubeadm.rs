//! Running the real kubeadm: the lab's own PKI and kubeconfigs, and each simulated node's
//! host root (chrooted with kubeadm's global `--rootfs`, so paths in the files are the node's).

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use crate::error::Result;
use crate::process::run;

/// The CRI socket kubeadm records on nodes; there is no runtime behind it in the lab.
pub const CRI_SOCKET: &str = "unix:///var/run/containerd/containerd.sock";
/// The lab cluster's name in kubeconfigs.
pub const CLUSTER_NAME: &str = "bosun-lab";
/// Service network of the lab (kubeadm's default).
pub const SERVICE_SUBNET: &str = "10.96.0.0/12";

/// What differs between the kubeadm configurations the lab writes.
#[derive(Debug)]
pub(crate) struct KubeadmConfig<'a> {
    pub node_name: &'a str,
    pub advertise_address: &'a str,
    pub kubernetes_version: &'a str,
    pub apiserver_port: u16,
    pub certificates_dir: &'a str,
    pub etcd_data_dir: &'a str,
}

impl KubeadmConfig<'_> {
    /// An `InitConfiguration` + `ClusterConfiguration` (kubeadm.k8s.io/v1beta4). The version is
    /// pinned (the default `stable-1` would ask the internet) and the advertise address is a set,
    /// non-loopback address (which skips interface detection), so kubeadm runs offline.
    pub fn render(&self) -> String {
        let KubeadmConfig {
            node_name,
            advertise_address,
            kubernetes_version,
            apiserver_port,
            certificates_dir,
            etcd_data_dir,
        } = self;
        format!(
            r#"apiVersion: kubeadm.k8s.io/v1beta4
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: "{advertise_address}"
  bindPort: {apiserver_port}
nodeRegistration:
  name: "{node_name}"
  criSocket: "{CRI_SOCKET}"
---
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
clusterName: {CLUSTER_NAME}
kubernetesVersion: "{kubernetes_version}"
controlPlaneEndpoint: "127.0.0.1:{apiserver_port}"
certificatesDir: "{certificates_dir}"
networking:
  serviceSubnet: "{SERVICE_SUBNET}"
  podSubnet: "10.244.0.0/16"
  dnsDomain: cluster.local
apiServer:
  certSANs: ["127.0.0.1", "localhost"]
etcd:
  local:
    dataDir: "{etcd_data_dir}"
"#
        )
    }
}

/// Runs `kubeadm args` on the host.
pub(crate) fn kubeadm(kubeadm: &Path, args: &[&str]) -> Result<String> {
    run(Command::new(kubeadm).args(args))
}

/// A command running `kubeadm --rootfs <root> args`: kubeadm chroots into the node's host root
/// before it does anything, so `/etc/kubernetes` is the node's. chroot needs CAP_SYS_CHROOT: as a
/// normal user the command runs in a new user namespace mapped to root (`unshare -r`).
pub fn kubeadm_in_root(kubeadm: &Path, root: &Path, args: &[&str]) -> Command {
    let mut cmd = if is_root() {
        Command::new(kubeadm)
    } else {
        let mut c = Command::new("unshare");
        c.args(["--map-root-user", "--user"]).arg(kubeadm);
        c
    };
    cmd.arg("--rootfs").arg(root).args(args);
    cmd
}

pub(crate) fn run_in_root(kubeadm: &Path, root: &Path, args: &[&str]) -> Result<String> {
    run(&mut kubeadm_in_root(kubeadm, root, args))
}

fn is_root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_pins_the_version_and_a_non_loopback_address() {
        let text = KubeadmConfig {
            node_name: "lab-cp-1",
            advertise_address: "10.200.0.2",
            kubernetes_version: "v1.34.4",
            apiserver_port: 16443,
            certificates_dir: "/etc/kubernetes/pki",
            etcd_data_dir: "/var/lib/etcd",
        }
        .render();
        assert!(text.contains("kubernetesVersion: \"v1.34.4\""));
        assert!(text.contains("advertiseAddress: \"10.200.0.2\""));
        assert!(text.contains("controlPlaneEndpoint: \"127.0.0.1:16443\""));
        assert!(text.contains("certificatesDir: \"/etc/kubernetes/pki\""));
        assert_eq!(
            text.matches("apiVersion: kubeadm.k8s.io/v1beta4").count(),
            2
        );
    }
}
