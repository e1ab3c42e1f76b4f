//! Fleet nodes: many cheap simulated Nodes for scale benchmarks and tests
//! (`lab nodes add --count N --prefix fleet-`, `lab nodes remove --prefix fleet-`).
//!
//! A fleet node is a Node object made like the lab's own nodes (kubeadm's worker labels,
//! Ready through the status subresource, [`SIMULATED_LABEL`](crate::nodes::SIMULATED_LABEL))
//! plus [`FLEET_LABEL`], and a small host root: `/etc/os-release`, `/etc/hostname` and the
//! empty directories a worker has. Unlike the lab's nodes it gets no kubeadm binary and no
//! kubelet kubeconfig (a copy of kubeadm per node would cost ~100 MB each), so it suits
//! Operations whose steps do not read those files. Fleet nodes are not in `state.json`:
//! `lab up` with another shape removes them like any simulated node it did not plan.
//!
//! While fleet nodes exist, an Operation without a node selector selects them too: remove
//! them when done.

use std::path::Path;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams};

use crate::error::{LabError, Result};
use crate::lab::LabHandle;
use crate::nodes::{self, LabNode, Role};

/// Label on every fleet node; its value is the prefix the node was added with (without a
/// trailing `-`, `.` or `_`, which a label value cannot end with).
pub const FLEET_LABEL: &str = "lab.bosun.dev/fleet";

/// Most fleet nodes one call adds (the addresses are made up from the index).
pub const MAX_FLEET: u32 = 60_000;

/// Node objects written at once.
const CONCURRENCY: usize = 32;

/// The label value of `prefix`.
pub fn fleet_label_value(prefix: &str) -> String {
    prefix
        .trim_end_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// The fleet nodes `prefix` + `0001` … `prefix` + `count` (zero-padded to 4 digits), with
/// their host roots under `<state dir>/nodes/`.
pub fn fleet_plan(state_dir: &Path, prefix: &str, count: u32) -> Vec<LabNode> {
    (1..=count)
        .map(|i| {
            let name = format!("{prefix}{i:04}");
            LabNode {
                host_root: state_dir.join("nodes").join(&name),
                os: nodes::os_pretty(i),
                internal_ip: format!("10.201.{}.{}", i / 250, i % 250 + 1),
                name,
                role: Role::Worker,
            }
        })
        .collect()
}

fn check_prefix(prefix: &str) -> Result<()> {
    let value = fleet_label_value(prefix);
    let ok_chars = prefix
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
    if value.is_empty()
        || !ok_chars
        || !prefix.starts_with(|c: char| c.is_ascii_alphanumeric())
        || prefix.len() > 40
    {
        return Err(LabError::Invalid(format!(
            "fleet prefix {prefix:?}: use 1-40 lowercase letters, digits, '-' or '.', starting with a letter or digit (e.g. fleet-)"
        )));
    }
    Ok(())
}

/// Adds (or brings back to Ready) `count` fleet nodes named `prefix0001`…, with their host
/// roots. Idempotent. Returns the nodes.
pub async fn add_fleet_nodes(lab: &LabHandle, prefix: &str, count: u32) -> Result<Vec<LabNode>> {
    check_prefix(prefix)?;
    if count == 0 || count > MAX_FLEET {
        return Err(LabError::Invalid(format!(
            "--count {count}: add between 1 and {MAX_FLEET} fleet nodes"
        )));
    }
    if let Some(clash) = lab.nodes.iter().find(|n| n.name.starts_with(prefix)) {
        return Err(LabError::Invalid(format!(
            "fleet prefix {prefix:?} matches the lab's own node {}; pick another prefix (e.g. fleet-)",
            clash.name
        )));
    }
    let plan = fleet_plan(&lab.state_dir, prefix, count);
    for node in &plan {
        nodes::prepare_fleet_root(node)?;
    }
    let api: Api<Node> = Api::all(lab.client.clone());
    let label = fleet_label_value(prefix);
    let version = &lab.kubernetes_version;
    futures::stream::iter(
        plan.iter().map(|node| {
            let api = api.clone();
            let label = label.clone();
            async move {
                nodes::apply_node_labelled(&api, node, version, &[(FLEET_LABEL, &label)]).await
            }
        }),
    )
    .buffer_unordered(CONCURRENCY)
    .try_collect::<Vec<()>>()
    .await?;
    Ok(plan)
}

/// Deletes the fleet nodes whose name starts with `prefix` (only Nodes carrying
/// [`FLEET_LABEL`]: never the lab's own) and their host roots. Returns how many went.
pub async fn remove_fleet_nodes(lab: &LabHandle, prefix: &str) -> Result<usize> {
    check_prefix(prefix)?;
    let api: Api<Node> = Api::all(lab.client.clone());
    let list = api
        .list(&ListParams::default().labels(FLEET_LABEL))
        .await
        .map_err(LabError::kube("listing the fleet Nodes"))?;
    let names: Vec<String> = list
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .filter(|n| n.starts_with(prefix))
        .collect();
    futures::stream::iter(names.iter().map(|name| {
        let api = api.clone();
        async move {
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                Err(e) => Err(LabError::kube(format!("deleting Node {name}"))(e)),
            }
        }
    }))
    .buffer_unordered(CONCURRENCY)
    .try_collect::<Vec<()>>()
    .await?;
    for name in &names {
        let root = lab.state_dir.join("nodes").join(name);
        if root.exists() {
            std::fs::remove_dir_all(&root).map_err(LabError::io("removing", &root))?;
        }
    }
    Ok(names.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fleet_names_are_padded_and_addresses_unique() {
        let plan = fleet_plan(Path::new("/s"), "fleet-", 1000);
        assert_eq!(plan[0].name, "fleet-0001");
        assert_eq!(plan[999].name, "fleet-1000");
        assert_eq!(plan[0].host_root, Path::new("/s/nodes/fleet-0001"));
        let ips: std::collections::BTreeSet<_> = plan.iter().map(|n| &n.internal_ip).collect();
        assert_eq!(ips.len(), 1000);
        assert_eq!(fleet_label_value("fleet-"), "fleet");
    }

    #[test]
    fn bad_prefixes_are_refused_with_the_rule() {
        for bad in ["", "-", "Fleet-", "a b", "fleet_"] {
            let e = check_prefix(bad).unwrap_err().to_string();
            assert!(e.contains("lowercase letters"), "{bad:?}: {e}");
        }
        check_prefix("fleet-").unwrap();
    }
}
