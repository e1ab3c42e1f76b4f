//! The Kubernetes-side code the Bosun controller and the agent share. The two binaries sit
//! side by side on this crate; neither depends on the other.
//!
//! - [`instance_selector`] and [`is_paused`]: the label and annotation contract (whose keys
//!   live in [`bosun_api::labels`]) as the two binaries read it.
//! - [`client`]: how both binaries reach the API server (a `User-Agent` naming the process, a
//!   first contact that waits for an API server that is restarting).
//! - [`cordon`]: the cordon a NodeTask relies on, checked before each step inside it (a
//!   step does not start on a node someone else uncordoned).
//! - [`policies`]: the cluster's Policy objects, watched and compiled once per generation of
//!   the set ([`PolicyWatch`](policies::PolicyWatch)), with a pool of evaluators.
//! - [`readers`]: what the policy inputs read from the cluster (its version, its annotations,
//!   the control-plane nodes, a node's roles and Ready condition, an Operation's reference).
//! - [`events`]: Events, under one reporter name per binary, with one note limit.
//! - [`status`]: the NodeTask status writes of a step's transitions (started, progress,
//!   finished, interrupted, task blocked), as typed patches.
//! - [`time`]: step times with microseconds.
//! - [`watch`]: how soon a broken watch is opened again (an API server that kubeadm restarts).
//! - [`Error`]: the errors both binaries share (an API call, a refused state transition, the
//!   policies not listed yet).

pub mod client;
pub mod cordon;
pub mod error;
pub mod events;
pub mod policies;
pub mod readers;
pub mod status;
pub mod time;
pub mod watch;

use bosun_api::labels;
use bosun_api::node_task::NodeTask;
use kube::ResourceExt;

pub use error::{Error, Result};

/// The label selector of the objects an install with `instance` acts on: those labelled
/// `bosun.dev/instance=<instance>`, or, with no instance, only those without the label
/// (so a default install never touches a side-by-side install's objects).
pub fn instance_selector(instance: Option<&str>) -> String {
    match instance {
        Some(name) => format!("{}={name}", labels::INSTANCE),
        None => format!("!{}", labels::INSTANCE),
    }
}

/// True when the task carries [`labels::annotations::PAUSED`] set to `"true"`: its
/// Operation is paused, so no new step of it starts.
pub fn is_paused(task: &NodeTask) -> bool {
    task.annotations()
        .get(labels::annotations::PAUSED)
        .is_some_and(|v| v == "true")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_selects_its_label_and_no_instance_selects_objects_without_it() {
        assert_eq!(instance_selector(Some("lab-1")), "bosun.dev/instance=lab-1");
        assert_eq!(instance_selector(None), "!bosun.dev/instance");
    }

    #[test]
    fn only_a_true_pause_annotation_pauses_a_task() {
        let spec = serde_json::from_value(serde_json::json!({
            "operation": "op", "nodeName": "n1", "group": "all", "steps": []
        }))
        .unwrap();
        let mut task = NodeTask::new("t", spec);
        assert!(!is_paused(&task));
        task.annotations_mut()
            .insert(labels::annotations::PAUSED.into(), "false".into());
        assert!(!is_paused(&task));
        task.annotations_mut()
            .insert(labels::annotations::PAUSED.into(), "true".into());
        assert!(is_paused(&task));
    }
}
