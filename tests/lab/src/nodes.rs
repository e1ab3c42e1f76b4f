//! Simulated nodes: a Node object each (kubeadm's labels and taints, kept Ready through the
//! status subresource since there is no kubelet) and a host root directory each, holding the
//! files a real kubeadm node has.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::{LabError, Result};
use crate::kubeadm::{self, KubeadmConfig};

/// Label on every Node the lab created (and may delete again).
pub const SIMULATED_LABEL: &str = "lab.bosun.dev/simulated";
/// Annotation holding the node's host root directory on the machine running the lab.
pub const HOST_ROOT_ANNOTATION: &str = "lab.bosun.dev/host-root";
/// kubeadm's control-plane role label and taint key.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
const FIELD_MANAGER: &str = "bosun-lab";

/// A node's role in the kubeadm cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Runs (in a real cluster) the control-plane static pods; carries kubeadm's taint.
    ControlPlane,
    /// Runs workloads.
    Worker,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(match self {
            Self::ControlPlane => "control-plane",
            Self::Worker => "worker",
        })
    }
}

/// One simulated node of the lab.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabNode {
    /// Node object name (also the hostname in its root).
    pub name: String,
    /// Control plane or worker.
    pub role: Role,
    /// The node's host root: what `/` is for an agent on this node.
    pub host_root: PathBuf,
    /// `PRETTY_NAME` of its /etc/os-release.
    pub os: String,
    /// Its InternalIP, in [`NODE_NETWORK`]; nothing listens there.
    pub internal_ip: String,
}

/// The made-up network of the simulated nodes' addresses. Not loopback: kubeadm (1.34) reads a
/// loopback advertise address as "pick a global address on lo", which fails on most machines.
pub const NODE_NETWORK: &str = "10.200.0.0/16";
/// The advertise address recorded in the lab's own PKI (the first address of [`NODE_NETWORK`]);
/// the running API server itself advertises and listens on 127.0.0.1.
pub const LAB_ADVERTISE_ADDRESS: &str = "10.200.0.1";

/// The address of a node: control plane k is 10.200.0.(k+1); worker k is 10.200.1.k onwards (250
/// per third octet). Derived from the name, not the position, so reshaping the lab never gives
/// a node (and the certificates in its root) another address.
fn node_ip(role: Role, k: u32) -> String {
    match role {
        Role::ControlPlane => format!("10.200.0.{}", k + 1),
        Role::Worker => {
            let n = k - 1;
            format!("10.200.{}.{}", 1 + n / 250, n % 250 + 1)
        }
    }
}

/// An /etc/os-release flavour.
struct OsRelease {
    pretty: &'static str,
    text: &'static str,
}

/// Nodes cycle through these, so every lab of two or more nodes has Debian-like and RHEL-like
/// roots.
const OS_RELEASES: [OsRelease; 4] = [
    OsRelease {
        pretty: "Debian GNU/Linux 12 (bookworm)",
        text: "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nNAME=\"Debian GNU/Linux\"\nVERSION_ID=\"12\"\nVERSION=\"12 (bookworm)\"\nVERSION_CODENAME=bookworm\nID=debian\nHOME_URL=\"https://www.debian.org/\"\n",
    },
    OsRelease {
        pretty: "Rocky Linux 9.4 (Blue Onyx)",
        text: "NAME=\"Rocky Linux\"\nVERSION=\"9.4 (Blue Onyx)\"\nID=\"rocky\"\nID_LIKE=\"rhel centos fedora\"\nVERSION_ID=\"9.4\"\nPLATFORM_ID=\"platform:el9\"\nPRETTY_NAME=\"Rocky Linux 9.4 (Blue Onyx)\"\nANSI_COLOR=\"0;32\"\nHOME_URL=\"https://rockylinux.org/\"\n",
    },
    OsRelease {
        pretty: "Ubuntu 24.04.1 LTS",
        text: "PRETTY_NAME=\"Ubuntu 24.04.1 LTS\"\nNAME=\"Ubuntu\"\nVERSION_ID=\"24.04\"\nVERSION=\"24.04.1 LTS (Noble Numbat)\"\nVERSION_CODENAME=noble\nID=ubuntu\nID_LIKE=debian\nUBUNTU_CODENAME=noble\n",
    },
    OsRelease {
        pretty: "AlmaLinux 9.4 (Seafoam Ocelot)",
        text: "NAME=\"AlmaLinux\"\nVERSION=\"9.4 (Seafoam Ocelot)\"\nID=\"almalinux\"\nID_LIKE=\"rhel centos fedora\"\nVERSION_ID=\"9.4\"\nPLATFORM_ID=\"platform:el9\"\nPRETTY_NAME=\"AlmaLinux 9.4 (Seafoam Ocelot)\"\n",
    },
];

/// The nodes of a lab with `nodes` nodes, the first `control_planes` of them control planes.
/// Name, root, OS and address of a node depend only on its name, so `lab up` with another
/// shape keeps the nodes it shares with the old one unchanged. Control plane k gets OS k-1 and
/// worker k gets OS k of [`OS_RELEASES`], so any two nodes include Debian and Rocky Linux.
pub(crate) fn plan(state_dir: &Path, nodes: u32, control_planes: u32) -> Vec<LabNode> {
    (0..nodes)
        .map(|i| {
            let (role, k, name, os_slot) = if i < control_planes {
                (Role::ControlPlane, i + 1, format!("lab-cp-{}", i + 1), i)
            } else {
                let k = i - control_planes + 1;
                (Role::Worker, k, format!("lab-worker-{k}"), k)
            };
            LabNode {
                host_root: state_dir.join("nodes").join(&name),
                os: OS_RELEASES[os_slot as usize % OS_RELEASES.len()]
                    .pretty
                    .to_string(),
                internal_ip: node_ip(role, k),
                name,
                role,
            }
        })
        .collect()
}

/// The `PRETTY_NAME` of the OS a fleet node with index `i` gets (cycling like the lab's
/// workers).
pub(crate) fn os_pretty(i: u32) -> String {
    OS_RELEASES[i as usize % OS_RELEASES.len()]
        .pretty
        .to_string()
}

/// A fleet node's small host root (see [`crate::fleet`]): os-release, hostname and the
/// directories of a worker, no kubeadm binary. Writes only what is missing.
pub(crate) fn prepare_fleet_root(node: &LabNode) -> Result<()> {
    let root = &node.host_root;
    for dir in ["etc/kubernetes/pki", "usr/bin", "tmp", "var/lib"] {
        mkdir(&root.join(dir))?;
    }
    let os = OS_RELEASES
        .iter()
        .find(|o| o.pretty == node.os)
        .expect("fleet_plan() picks the OS from OS_RELEASES");
    write_if_missing(&root.join("etc/os-release"), os.text)?;
    write_if_missing(&root.join("etc/hostname"), &format!("{}\n", node.name))
}

/// What building a host root needs from the lab.
pub(crate) struct RootContext<'a> {
    pub kubeadm: &'a Path,
    pub lab_pki: &'a Path,
    pub kubernetes_version: &'a str,
    pub apiserver_port: u16,
}

/// Shared cluster secrets every control plane of a kubeadm cluster holds (`kubeadm join
/// --control-plane` copies exactly these); leaf certificates are each node's own.
const SHARED_PKI: [&str; 8] = [
    "ca.crt",
    "ca.key",
    "front-proxy-ca.crt",
    "front-proxy-ca.key",
    "etcd/ca.crt",
    "etcd/ca.key",
    "sa.key",
    "sa.pub",
];

/// Makes `node`'s host root look like a kubeadm node, doing only what is missing (so files a
/// plugin changed stay changed): /etc/os-release, /etc/hostname, /usr/bin/kubeadm (a copy of the
/// real binary); control planes: /etc/kubernetes/{pki, *.conf, manifests/*.yaml} made by kubeadm
/// from the lab's CAs; workers: /etc/kubernetes/kubelet.conf and pki/ca.crt.
pub(crate) fn prepare_root(node: &LabNode, ctx: &RootContext<'_>) -> Result<()> {
    let root = &node.host_root;
    for dir in ["etc/kubernetes/pki", "usr/bin", "tmp", "var/lib"] {
        mkdir(&root.join(dir))?;
    }
    let os = OS_RELEASES
        .iter()
        .find(|o| o.pretty == node.os)
        .expect("plan() picks the OS from OS_RELEASES");
    write_if_missing(&root.join("etc/os-release"), os.text)?;
    write_if_missing(&root.join("etc/hostname"), &format!("{}\n", node.name))?;
    let kubeadm_copy = root.join("usr/bin/kubeadm");
    if !kubeadm_copy.exists() {
        // A copy, not a link: a plugin that replaces or truncates it must not touch the others.
        let tmp = root.join("usr/bin/.kubeadm.tmp");
        std::fs::copy(ctx.kubeadm, &tmp).map_err(LabError::io("copying kubeadm to", &tmp))?;
        std::fs::rename(&tmp, &kubeadm_copy).map_err(LabError::io("renaming", &kubeadm_copy))?;
    }

    let pki = root.join("etc/kubernetes/pki");
    let config = KubeadmConfig {
        node_name: &node.name,
        advertise_address: &node.internal_ip,
        kubernetes_version: ctx.kubernetes_version,
        apiserver_port: ctx.apiserver_port,
        certificates_dir: "/etc/kubernetes/pki",
        etcd_data_dir: "/var/lib/etcd",
    }
    .render();
    match node.role {
        Role::ControlPlane => {
            if root.join("etc/kubernetes/manifests/etcd.yaml").exists() {
                return Ok(());
            }
            for file in SHARED_PKI {
                copy_if_missing(&ctx.lab_pki.join(file), &pki.join(file))?;
            }
            // Kept in the root, where an administrator of a kubeadm node would keep it.
            let config_path = root.join("etc/kubernetes/kubeadm-config.yaml");
            write(&config_path, &config)?;
            let cfg = "/etc/kubernetes/kubeadm-config.yaml";
            for phase in [
                &["init", "phase", "certs", "all", "--config", cfg][..],
                &["init", "phase", "kubeconfig", "all", "--config", cfg],
                &["init", "phase", "control-plane", "all", "--config", cfg],
                &["init", "phase", "etcd", "local", "--config", cfg],
            ] {
                kubeadm::run_in_root(ctx.kubeadm, root, phase)?;
            }
        }
        Role::Worker => {
            if root.join("etc/kubernetes/kubelet.conf").exists() {
                return Ok(());
            }
            // kubeadm signs the kubelet's client certificate with the cluster CA; a worker keeps
            // only ca.crt afterwards, as after `kubeadm join`.
            copy_if_missing(&ctx.lab_pki.join("ca.crt"), &pki.join("ca.crt"))?;
            copy_if_missing(&ctx.lab_pki.join("ca.key"), &pki.join("ca.key"))?;
            let config_path = root.join("tmp/kubeadm-config.yaml");
            write(&config_path, &config)?;
            let result = kubeadm::run_in_root(
                ctx.kubeadm,
                root,
                &[
                    "init",
                    "phase",
                    "kubeconfig",
                    "kubelet",
                    "--config",
                    "/tmp/kubeadm-config.yaml",
                ],
            );
            let _ = std::fs::remove_file(pki.join("ca.key"));
            let _ = std::fs::remove_file(&config_path);
            result?;
        }
    }
    Ok(())
}

/// Creates or updates the Node object and sets its status Ready (server-side apply, field
/// manager `bosun-lab`; the status through the status subresource, as a kubelet would).
pub(crate) async fn apply_node(
    api: &Api<Node>,
    node: &LabNode,
    kubelet_version: &str,
) -> Result<()> {
    apply_node_labelled(api, node, kubelet_version, &[]).await
}

/// [`apply_node`] with extra labels.
pub(crate) async fn apply_node_labelled(
    api: &Api<Node>,
    node: &LabNode,
    kubelet_version: &str,
    extra_labels: &[(&str, &str)],
) -> Result<()> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let cp = node.role == Role::ControlPlane;
    let mut labels = json!({
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": arch,
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": arch,
        SIMULATED_LABEL: "true",
    });
    for (key, value) in extra_labels {
        labels[*key] = json!(value);
    }
    let mut taints = json!([]);
    if cp {
        labels[CONTROL_PLANE_LABEL] = json!("");
        labels["node.kubernetes.io/exclude-from-external-load-balancers"] = json!("");
        taints = json!([{ "key": CONTROL_PLANE_LABEL, "effect": "NoSchedule" }]);
    }
    let object = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": labels,
            "annotations": {
                "kubeadm.alpha.kubernetes.io/cri-socket": kubeadm::CRI_SOCKET,
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                HOST_ROOT_ANNOTATION: node.host_root.display().to_string(),
            },
        },
        "spec": { "taints": taints },
    });
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&node.name, &pp, &Patch::Apply(&object))
        .await
        .map_err(LabError::kube(format!("applying Node {}", node.name)))?;

    // Whole seconds: the API's timestamps have no fraction.
    let now =
        k8s_openapi::jiff::Timestamp::from_second(k8s_openapi::jiff::Timestamp::now().as_second())
            .map_or_else(|_| String::new(), |t| t.to_string());
    let condition = |type_: &str, status: &str, reason: &str, message: &str| {
        json!({ "type": type_, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": now, "lastTransitionTime": now })
    };
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let status = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": { "name": node.name },
        "status": {
            "conditions": [
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "simulated by the Bosun lab"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "simulated by the Bosun lab"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "simulated by the Bosun lab"),
                condition("Ready", "True", "KubeletReady", "simulated by the Bosun lab: no kubelet runs"),
            ],
            "addresses": [
                { "type": "InternalIP", "address": node.internal_ip },
                { "type": "Hostname", "address": node.name },
            ],
            "capacity": { "cpu": "2", "memory": "4Gi", "pods": "110", "ephemeral-storage": "20Gi" },
            "allocatable": { "cpu": "2", "memory": "4Gi", "pods": "110", "ephemeral-storage": "20Gi" },
            "daemonEndpoints": { "kubeletEndpoint": { "Port": 10250 } },
            "nodeInfo": {
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": kernel.trim(),
                "osImage": node.os,
                "containerRuntimeVersion": "none://simulated",
                "kubeletVersion": kubelet_version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": arch,
            },
        },
    });
    api.patch_status(&node.name, &pp, &Patch::Apply(&status))
        .await
        .map_err(LabError::kube(format!(
            "setting the status of Node {}",
            node.name
        )))?;
    Ok(())
}

/// Deletes simulated Node objects (and their roots) that are not in `keep`: `lab up` with fewer
/// nodes shrinks the lab.
pub(crate) async fn remove_others(
    api: &Api<Node>,
    keep: &[LabNode],
    state_dir: &Path,
) -> Result<Vec<String>> {
    let list = api
        .list(&ListParams::default().labels(&format!("{SIMULATED_LABEL}=true")))
        .await
        .map_err(LabError::kube("listing the lab's Nodes"))?;
    let mut removed = Vec::new();
    for node in list {
        let name = node.metadata.name.unwrap_or_default();
        if keep.iter().any(|k| k.name == name) {
            continue;
        }
        api.delete(&name, &DeleteParams::default())
            .await
            .map_err(LabError::kube(format!("deleting Node {name}")))?;
        let root = state_dir.join("nodes").join(&name);
        if root.exists() {
            std::fs::remove_dir_all(&root).map_err(LabError::io("removing", &root))?;
        }
        removed.push(name);
    }
    Ok(removed)
}

fn mkdir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(LabError::io("creating", dir))
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(LabError::io("writing", path))
}

fn write_if_missing(path: &Path, text: &str) -> Result<()> {
    if path.exists() {
        Ok(())
    } else {
        write(path, text)
    }
}

fn copy_if_missing(from: &Path, to: &Path) -> Result<()> {
    if to.exists() {
        return Ok(());
    }
    if let Some(dir) = to.parent() {
        mkdir(dir)?;
    }
    std::fs::copy(from, to).map_err(LabError::io("copying to", to))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_puts_control_planes_first_and_mixes_os_families() {
        let nodes = plan(Path::new("/state"), 5, 2);
        let names: Vec<_> = nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "lab-cp-1",
                "lab-cp-2",
                "lab-worker-1",
                "lab-worker-2",
                "lab-worker-3"
            ]
        );
        assert_eq!(nodes[1].role, Role::ControlPlane);
        assert_eq!(nodes[2].role, Role::Worker);
        assert_eq!(nodes[2].host_root, Path::new("/state/nodes/lab-worker-1"));
        assert!(nodes[0].os.starts_with("Debian") && nodes[1].os.starts_with("Rocky"));
        assert_eq!(
            (nodes[0].internal_ip.as_str(), nodes[2].internal_ip.as_str()),
            ("10.200.0.2", "10.200.1.1")
        );
    }

    #[test]
    fn node_addresses_are_unique_and_never_the_labs_own() {
        let cps = (1..=100).map(|k| node_ip(Role::ControlPlane, k));
        let workers = (1..=1000).map(|k| node_ip(Role::Worker, k));
        let ips: std::collections::BTreeSet<_> = cps.chain(workers).collect();
        assert_eq!(ips.len(), 1100);
        assert!(!ips.contains(LAB_ADVERTISE_ADDRESS));
        assert!(ips.iter().all(|ip| {
            let last: u32 = ip.rsplit('.').next().unwrap().parse().unwrap();
            (1..=251).contains(&last) && ip.starts_with("10.200.")
        }));
    }

    #[test]
    fn reshaping_keeps_each_remaining_node_as_it_was() {
        let small = plan(Path::new("/state"), 3, 1);
        let big = plan(Path::new("/state"), 6, 2);
        for node in &small {
            if let Some(same) = big.iter().find(|n| n.name == node.name) {
                assert_eq!(same, node);
            }
        }
        assert!(big.iter().any(|n| n.name == "lab-worker-1"));
    }
}
