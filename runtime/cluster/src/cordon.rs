//! The cordon a NodeTask relies on, watched: between the step that cordoned the node and the
//! task's `uncordon`, every agent step and every `drain` is checked, right before it starts,
//! against the Node as it is. If someone else cleared the cordon meanwhile (`kubectl
//! uncordon`, another operator re-handling an old job), the step does not start: it fails,
//! and the task blocks with reason `CordonCleared` and a message that names the node, the
//! step that cordoned it and what to do.
//!
//! Bosun blocks; it does not cordon the node again behind the person's back. Pods may have
//! been scheduled onto the node since the cordon was cleared, so cordoning again alone would
//! not make the step safe: the drain that emptied the node is in the past. The person
//! decides: cordon (and drain) the node again by hand and retry, or skip the node.
//!
//! The agent (before an agent step) and the controller (before each pass of a `drain`)
//! share this module; both read the Node from the API server, not from a cache. What is
//! pure here — which steps run inside the window ([`cordon_window`]), whether a step may
//! start ([`refusal`]) — is tested as a table below.

use bosun_api::node_task::{NodeTask, StepPhase};
use bosun_api::operation::RunsOn;
use bosun_planner::plan::controller_actions;
use bosun_planner::state::step_status;

/// The stable code of the step error a cleared cordon records.
pub const CODE: &str = "cordon-cleared";

/// Whether the controller step `action` leaves the node cordoned when it succeeds: a
/// `cordon`, and a `drain` (which cordons the node before it evicts).
fn cordons(action: &str) -> bool {
    action == controller_actions::CORDON || action == controller_actions::DRAIN
}

/// The name of the step whose cordon step `index` of `task` runs under, if it does: the
/// first controller `cordon` (or `drain`, which cordons too) that succeeded before `index`
/// with no `uncordon` step between it and `index`. `None` when step `index` runs outside
/// such a window:
///
/// - no cordon or drain before it, or none that succeeded (a step a person skipped cordoned
///   nothing: Bosun does not rely on a cordon it did not make);
/// - an `uncordon` step lies between (whatever its phase: the plan has the node schedulable
///   there), or step `index` is the `uncordon` itself (uncordoning an uncordoned node is
///   harmless);
/// - the task is a dry run (its `cordon` changed nothing);
/// - `index` is past the end of the steps.
pub fn cordon_window(task: &NodeTask, index: usize) -> Option<String> {
    let steps = &task.spec.steps;
    let step = steps.get(index)?;
    if task.spec.dry_run
        || (step.runs_on == RunsOn::Controller && step.action == controller_actions::UNCORDON)
    {
        return None;
    }
    let statuses = task
        .status
        .as_ref()
        .map(|s| s.steps.as_slice())
        .unwrap_or_default();
    let mut window: Option<&str> = None;
    for earlier in steps[..index]
        .iter()
        .filter(|s| s.runs_on == RunsOn::Controller)
    {
        if earlier.action == controller_actions::UNCORDON {
            window = None;
        } else if cordons(&earlier.action)
            && window.is_none()
            && step_status(statuses, &earlier.name).is_some_and(|s| s.phase == StepPhase::Succeeded)
        {
            window = Some(&earlier.name);
        }
    }
    window.map(str::to_string)
}

/// Why step `index` of `task` must not start now, when its node's `spec.unschedulable` is
/// `unschedulable` (`None`: the Node could not be found; that is for the NodeGone rule to
/// judge, not this one): the message of the refusal when the step runs inside a cordon's
/// window ([`cordon_window`]) and the node is schedulable. `None`: the step may start.
pub fn refusal(task: &NodeTask, index: usize, unschedulable: Option<bool>) -> Option<String> {
    if unschedulable != Some(false) {
        return None;
    }
    let cordon = cordon_window(task, index)?;
    let step = &task.spec.steps[index];
    Some(message(
        &task.spec.operation,
        &task.spec.node_name,
        &cordon,
        &step.name,
        step.runs_on == RunsOn::Controller && step.action == controller_actions::DRAIN,
    ))
}

/// The message of a refusal: node `node` of Operation `operation` is schedulable although
/// step `cordon` cordoned it, so step `step` (a drain when `drain`) did not start.
pub fn message(operation: &str, node: &str, cordon: &str, step: &str, drain: bool) -> String {
    let why = if drain {
        " (pods it evicted could be scheduled straight back)"
    } else {
        ""
    };
    format!(
        "node {node} is schedulable again: step `{cordon}` cordoned it, and someone else uncordoned it since (spec.unschedulable is false); Bosun does not start `{step}` on a schedulable node{why}. Cordon it again (kubectl cordon {node}; drain it if pods came back), then retry the step (kubectl bosun retry {operation} {node}); or skip the node (kubectl bosun skip {operation} {node}: Bosun leaves it as it is)"
    )
}

#[cfg(test)]
mod tests {
    use bosun_api::node_task::{NodeTaskStatus, StepStatus};
    use serde_json::json;

    use super::*;

    /// A task on node `w1` of Operation `op` with `steps` (`name:action`, a `@` in front
    /// for a controller step) and `phases` for some of them.
    fn task(steps: &[&str], phases: &[(&str, StepPhase)]) -> NodeTask {
        let steps: Vec<serde_json::Value> = steps
            .iter()
            .map(|s| match s.strip_prefix('@') {
                Some(s) => {
                    let (name, action) = s.split_once(':').unwrap();
                    json!({ "name": name, "runsOn": "controller", "action": action })
                }
                None => {
                    let (name, action) = s.split_once(':').unwrap();
                    json!({ "name": name, "plugin": "p", "action": action })
                }
            })
            .collect();
        let spec = serde_json::from_value(json!({
            "operation": "op", "nodeName": "w1", "group": "all", "steps": steps
        }))
        .unwrap();
        let mut task = NodeTask::new("op-w1", spec);
        task.status = Some(NodeTaskStatus {
            steps: phases
                .iter()
                .map(|(name, phase)| StepStatus {
                    name: name.to_string(),
                    phase: *phase,
                    attempts: 1,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        });
        task
    }

    use StepPhase::{Failed, Pending, Skipped, Succeeded};

    #[test]
    fn which_steps_run_inside_the_window_of_a_cordon() {
        let usual = [
            "@cordon:cordon",
            "@drain:drain",
            "upgrade:install",
            "@wait:waitNodeReady",
            "@uncordon:uncordon",
            "after:greet",
        ];
        /// (case, steps, their phases, the step asked about, the window it runs in)
        type Case<'a> = (
            &'a str,
            &'a [&'a str],
            &'a [(&'a str, StepPhase)],
            usize,
            Option<&'a str>,
        );
        #[rustfmt::skip]
        let cases: &[Case] = &[
            ("no cordon step", &["a:greet", "b:greet"], &[("a", Succeeded)], 1, None),
            ("cordon pending", &["@cordon:cordon", "a:greet"], &[("cordon", Pending)], 1, None),
            ("cordon failed", &["@cordon:cordon", "a:greet"], &[("cordon", Failed)], 1, None),
            ("cordon succeeded", &["@cordon:cordon", "a:greet"], &[("cordon", Succeeded)], 1, Some("cordon")),
            ("the cordon step itself", &["@cordon:cordon", "a:greet"], &[], 0, None),
            ("cordon skipped by a person", &["@cordon:cordon", "a:greet"], &[("cordon", Skipped)], 1, None),
            ("a drain cordons too", &["@drain:drain", "a:greet"], &[("drain", Succeeded)], 1, Some("drain")),
            ("the drain after a cordon is in its window", &usual, &[("cordon", Succeeded)], 1, Some("cordon")),
            ("the window is named by its first cordon", &usual, &[("cordon", Succeeded), ("drain", Succeeded)], 2, Some("cordon")),
            ("cordon skipped, drain cordoned", &usual, &[("cordon", Skipped), ("drain", Succeeded)], 2, Some("drain")),
            ("a wait inside the window", &usual, &[("cordon", Succeeded), ("drain", Succeeded), ("upgrade", Succeeded)], 3, Some("cordon")),
            ("the uncordon step itself", &usual, &[("cordon", Succeeded), ("drain", Succeeded), ("upgrade", Succeeded), ("wait", Succeeded)], 4, None),
            ("after the uncordon", &usual, &[("cordon", Succeeded), ("drain", Succeeded), ("upgrade", Succeeded), ("wait", Succeeded), ("uncordon", Succeeded)], 5, None),
            ("after a skipped uncordon", &usual, &[("cordon", Succeeded), ("drain", Succeeded), ("upgrade", Succeeded), ("wait", Succeeded), ("uncordon", Skipped)], 5, None),
            ("a second window", &["@c1:cordon", "@u1:uncordon", "a:greet", "@c2:cordon", "b:greet"], &[("c1", Succeeded), ("u1", Succeeded), ("a", Succeeded), ("c2", Succeeded)], 4, Some("c2")),
            ("between two windows", &["@c1:cordon", "@u1:uncordon", "a:greet", "@c2:cordon", "b:greet"], &[("c1", Succeeded), ("u1", Succeeded)], 2, None),
            ("an agent step named like a controller action", &["cordon:cordon", "a:greet"], &[("cordon", Succeeded)], 1, None),
            ("past the end", &["@cordon:cordon"], &[("cordon", Succeeded)], 1, None),
        ];
        for (case, steps, phases, index, want) in cases {
            let t = task(steps, phases);
            assert_eq!(cordon_window(&t, *index).as_deref(), *want, "{case}");
        }

        // A dry run's cordon changed nothing: no window.
        let mut dry = task(&["@cordon:cordon", "a:greet"], &[("cordon", Succeeded)]);
        dry.spec.dry_run = true;
        assert_eq!(cordon_window(&dry, 1), None);
    }

    #[test]
    fn a_step_in_the_window_does_not_start_on_a_schedulable_node() {
        let t = task(
            &[
                "@cordon:cordon",
                "@drain:drain",
                "upgrade-kubelet:install",
                "@uncordon:uncordon",
            ],
            &[("cordon", Succeeded), ("drain", Succeeded)],
        );
        // Cordoned (or the Node is not found): the step starts.
        assert_eq!(refusal(&t, 2, Some(true)), None);
        assert_eq!(refusal(&t, 2, None), None);
        // Outside the window: the step starts whatever the node is.
        assert_eq!(refusal(&t, 3, Some(false)), None);
        assert_eq!(refusal(&t, 0, Some(false)), None);
        // Uncordoned by someone else: refused, and the message says what to do.
        assert_eq!(
            refusal(&t, 2, Some(false)).as_deref(),
            Some(
                "node w1 is schedulable again: step `cordon` cordoned it, and someone else uncordoned it since (spec.unschedulable is false); Bosun does not start `upgrade-kubelet` on a schedulable node. Cordon it again (kubectl cordon w1; drain it if pods came back), then retry the step (kubectl bosun retry op w1); or skip the node (kubectl bosun skip op w1: Bosun leaves it as it is)"
            )
        );
        // A drain says why draining a schedulable node is pointless.
        let drain = refusal(&t, 1, Some(false)).unwrap();
        assert!(
            drain.contains("Bosun does not start `drain` on a schedulable node (pods it evicted could be scheduled straight back)"),
            "{drain}"
        );
    }
}
