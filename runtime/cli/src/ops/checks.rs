//! The state checks `approve`, `retry`, `skip`, `pause` and `resume` make before they
//! change anything. Pure functions of the resources, so each refusal is unit-tested; the
//! message of every [`Refusal`] says what was found and what to do instead.

use bosun_api::node_task::{NodeTask, NodeTaskPhase};
use bosun_api::operation::{ExecutionMode, Operation, OperationPhase};

/// Why a command will not change anything.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "Operation {op} has already finished ({phase:?}); there is nothing left to {verb}. Start a new Operation for more work"
    )]
    OperationFinished {
        op: String,
        phase: OperationPhase,
        verb: &'static str,
    },
    #[error(
        "Operation {op} runs in {mode:?} mode, so no NodeTask waits for approval; approval applies only to executionMode: Controlled"
    )]
    NotControlled { op: String, mode: ExecutionMode },
    #[error("Operation {op} has no NodeTask for node {node}; its nodes are: {known}")]
    NoSuchNode {
        op: String,
        node: String,
        known: String,
    },
    #[error(
        "NodeTask {task} ({node}) is {phase:?}, not Blocked: {verb} only acts on a task that a failed step blocked. {hint}"
    )]
    NotBlocked {
        task: String,
        node: String,
        phase: NodeTaskPhase,
        verb: &'static str,
        hint: String,
    },
    #[error(
        "NodeTask {task} ({node}) already has recovery: {requested:?} set and the controller has not acted on it yet; wait for it (is bosun-controller running?)"
    )]
    RecoveryPending {
        task: String,
        node: String,
        requested: bosun_api::Recovery,
    },
    #[error(
        "NodeTask {task} ({node}) is {phase:?}: approval lets a task start, and this one {what}"
    )]
    NotApprovable {
        task: String,
        node: String,
        phase: NodeTaskPhase,
        what: &'static str,
    },
    #[error("NodeTask {task} ({node}) is already approved")]
    AlreadyApproved { task: String, node: String },
    #[error(
        "Operation {op}: no NodeTask is left to approve (every unfinished task is approved or past approval)"
    )]
    NothingToApprove { op: String },
    #[error("Operation {op} is already paused; resume it with `kubectl bosun resume {op}`")]
    AlreadyPaused { op: String },
    #[error(
        "Operation {op} is not paused; nothing to resume (pause it with `kubectl bosun pause {op}`)"
    )]
    NotPaused { op: String },
}

fn op_name(op: &Operation) -> String {
    op.metadata.name.clone().unwrap_or_default()
}

fn task_name(task: &NodeTask) -> String {
    task.metadata.name.clone().unwrap_or_default()
}

fn phase_of(task: &NodeTask) -> NodeTaskPhase {
    task.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

fn refuse_finished(op: &Operation, verb: &'static str) -> Result<(), Refusal> {
    let phase = op.status.as_ref().map(|s| s.phase).unwrap_or_default();
    if phase.is_finished() {
        return Err(Refusal::OperationFinished {
            op: op_name(op),
            phase,
            verb,
        });
    }
    Ok(())
}

/// The task of `node` among the Operation's tasks.
pub fn task_of<'a>(
    op: &Operation,
    tasks: &'a [NodeTask],
    node: &str,
) -> Result<&'a NodeTask, Refusal> {
    tasks
        .iter()
        .find(|t| t.spec.node_name == node)
        .ok_or_else(|| {
            let mut known: Vec<&str> = tasks.iter().map(|t| t.spec.node_name.as_str()).collect();
            known.sort_unstable();
            Refusal::NoSuchNode {
                op: op_name(op),
                node: node.to_owned(),
                known: if known.is_empty() {
                    "none yet (not planned, or the controller has not created its NodeTasks)".into()
                } else {
                    known.join(", ")
                },
            }
        })
}

/// `retry` and `skip`: the task must be Blocked and have no recovery pending.
pub fn recovery(op: &Operation, task: &NodeTask, verb: &'static str) -> Result<(), Refusal> {
    refuse_finished(op, verb)?;
    let phase = phase_of(task);
    let (task_name, node) = (task_name(task), task.spec.node_name.clone());
    if phase != NodeTaskPhase::Blocked {
        let opn = op_name(op);
        let hint = match phase {
            NodeTaskPhase::Pending => "It has not started yet; nothing failed.".to_owned(),
            NodeTaskPhase::AwaitingApproval => {
                format!("It waits for approval: `kubectl bosun approve {opn} {node}`.")
            }
            NodeTaskPhase::Running => {
                format!("It is running; follow it with `kubectl bosun status {opn} --watch`.")
            }
            NodeTaskPhase::Succeeded | NodeTaskPhase::Skipped | NodeTaskPhase::Invalid => {
                "It has finished; nothing to do.".to_owned()
            }
            NodeTaskPhase::Blocked => String::new(),
        };
        return Err(Refusal::NotBlocked {
            task: task_name,
            node,
            phase,
            verb,
            hint,
        });
    }
    if let Some(requested) = task.spec.recovery {
        return Err(Refusal::RecoveryPending {
            task: task_name,
            node,
            requested,
        });
    }
    Ok(())
}

/// `approve OP NODE...`: the Operation is Controlled and each task has not started and is
/// not approved yet (approving a Pending task ahead of its turn is allowed).
pub fn approve(op: &Operation, task: &NodeTask) -> Result<(), Refusal> {
    refuse_finished(op, "approve")?;
    if op.spec.execution_mode != ExecutionMode::Controlled {
        return Err(Refusal::NotControlled {
            op: op_name(op),
            mode: op.spec.execution_mode,
        });
    }
    let phase = phase_of(task);
    let what = match phase {
        NodeTaskPhase::Pending | NodeTaskPhase::AwaitingApproval => None,
        NodeTaskPhase::Running => Some("has already started"),
        NodeTaskPhase::Blocked => {
            Some("has already started and is blocked: use `kubectl bosun retry` or `skip`")
        }
        NodeTaskPhase::Succeeded | NodeTaskPhase::Skipped | NodeTaskPhase::Invalid => {
            Some("has already finished")
        }
    };
    if let Some(what) = what {
        return Err(Refusal::NotApprovable {
            task: task_name(task),
            node: task.spec.node_name.clone(),
            phase,
            what,
        });
    }
    if task.spec.approve {
        return Err(Refusal::AlreadyApproved {
            task: task_name(task),
            node: task.spec.node_name.clone(),
        });
    }
    Ok(())
}

/// `approve OP --all`: every task that [`approve`] accepts, in the order given. Refuses
/// when the Operation is not Controlled or no task is left to approve.
pub fn approve_all<'a>(
    op: &Operation,
    tasks: &'a [NodeTask],
) -> Result<Vec<&'a NodeTask>, Refusal> {
    refuse_finished(op, "approve")?;
    if op.spec.execution_mode != ExecutionMode::Controlled {
        return Err(Refusal::NotControlled {
            op: op_name(op),
            mode: op.spec.execution_mode,
        });
    }
    let chosen: Vec<&NodeTask> = tasks.iter().filter(|t| approve(op, t).is_ok()).collect();
    if chosen.is_empty() {
        return Err(Refusal::NothingToApprove { op: op_name(op) });
    }
    Ok(chosen)
}

/// `pause`: an unfinished Operation that is not paused yet.
pub fn pause(op: &Operation) -> Result<(), Refusal> {
    refuse_finished(op, "pause")?;
    if op.spec.paused {
        return Err(Refusal::AlreadyPaused { op: op_name(op) });
    }
    Ok(())
}

/// `resume`: an unfinished, paused Operation.
pub fn resume(op: &Operation) -> Result<(), Refusal> {
    refuse_finished(op, "resume")?;
    if !op.spec.paused {
        return Err(Refusal::NotPaused { op: op_name(op) });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bosun_api::Recovery;
    use bosun_api::node_task::{NodeTaskSpec, NodeTaskStatus};
    use bosun_api::operation::{OperationSpec, OperationStatus};

    fn op(mode: ExecutionMode, phase: OperationPhase) -> Operation {
        let spec: OperationSpec = serde_json::from_value(serde_json::json!({
            "custom": {"groups": [{"name": "all", "steps": [{"name": "greet", "plugin": "hello", "action": "greet"}]}]}
        }))
        .unwrap();
        let mut o = Operation::new("op1", spec);
        o.spec.execution_mode = mode;
        o.status = Some(OperationStatus {
            phase,
            ..Default::default()
        });
        o
    }

    fn task(node: &str, phase: NodeTaskPhase) -> NodeTask {
        let mut t = NodeTask::new(
            &format!("op1-{node}"),
            NodeTaskSpec {
                operation: "op1".into(),
                node_name: node.into(),
                group: "all".into(),
                steps: vec![],
                dry_run: false,
                step_timeout_seconds: None,
                approve: false,
                recovery: None,
            },
        );
        t.status = Some(NodeTaskStatus {
            phase,
            ..Default::default()
        });
        t
    }

    #[test]
    fn retry_and_skip_need_a_blocked_task() {
        let o = op(ExecutionMode::Auto, OperationPhase::Blocked);
        assert_eq!(
            recovery(&o, &task("n1", NodeTaskPhase::Blocked), "retry"),
            Ok(())
        );
        let e = recovery(&o, &task("n1", NodeTaskPhase::Running), "retry").unwrap_err();
        assert!(matches!(
            e,
            Refusal::NotBlocked {
                phase: NodeTaskPhase::Running,
                ..
            }
        ));
        let text = e.to_string();
        assert!(
            text.contains("op1-n1 (n1) is Running, not Blocked"),
            "{text}"
        );
        assert!(text.contains("kubectl bosun status op1 --watch"), "{text}");
        let text = recovery(&o, &task("n1", NodeTaskPhase::Succeeded), "skip")
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("is Succeeded, not Blocked: skip only acts") && text.contains("finished"),
            "{text}"
        );
        let text = recovery(&o, &task("n1", NodeTaskPhase::AwaitingApproval), "retry")
            .unwrap_err()
            .to_string();
        assert!(text.contains("kubectl bosun approve op1 n1"), "{text}");
    }

    #[test]
    fn a_second_recovery_waits_for_the_first() {
        let o = op(ExecutionMode::Auto, OperationPhase::Blocked);
        let mut t = task("n1", NodeTaskPhase::Blocked);
        t.spec.recovery = Some(Recovery::Skip);
        let e = recovery(&o, &t, "retry").unwrap_err();
        assert_eq!(
            e,
            Refusal::RecoveryPending {
                task: "op1-n1".into(),
                node: "n1".into(),
                requested: Recovery::Skip
            }
        );
    }

    #[test]
    fn finished_operations_refuse_everything() {
        let o = op(ExecutionMode::Controlled, OperationPhase::Succeeded);
        let t = task("n1", NodeTaskPhase::Blocked);
        for e in [
            recovery(&o, &t, "retry"),
            approve(&o, &t),
            pause(&o),
            resume(&o),
        ] {
            assert!(
                matches!(
                    e,
                    Err(Refusal::OperationFinished {
                        phase: OperationPhase::Succeeded,
                        ..
                    })
                ),
                "{e:?}"
            );
        }
    }

    #[test]
    fn approve_needs_controlled_mode_and_an_unstarted_unapproved_task() {
        let auto = op(ExecutionMode::Auto, OperationPhase::Running);
        let e = approve(&auto, &task("n1", NodeTaskPhase::Pending)).unwrap_err();
        assert!(e.to_string().contains("runs in Auto mode"), "{e}");
        let c = op(ExecutionMode::Controlled, OperationPhase::AwaitingApproval);
        assert_eq!(
            approve(&c, &task("n1", NodeTaskPhase::AwaitingApproval)),
            Ok(())
        );
        assert_eq!(approve(&c, &task("n1", NodeTaskPhase::Pending)), Ok(()));
        let e = approve(&c, &task("n1", NodeTaskPhase::Running)).unwrap_err();
        assert!(
            e.to_string().contains(
                "is Running: approval lets a task start, and this one has already started"
            ),
            "{e}"
        );
        let mut t = task("n1", NodeTaskPhase::AwaitingApproval);
        t.spec.approve = true;
        assert!(matches!(
            approve(&c, &t),
            Err(Refusal::AlreadyApproved { .. })
        ));
    }

    #[test]
    fn approve_all_takes_only_approvable_tasks() {
        let c = op(ExecutionMode::Controlled, OperationPhase::AwaitingApproval);
        let mut approved = task("n4", NodeTaskPhase::Pending);
        approved.spec.approve = true;
        let tasks = vec![
            task("n1", NodeTaskPhase::Succeeded),
            task("n2", NodeTaskPhase::AwaitingApproval),
            task("n3", NodeTaskPhase::Pending),
            approved,
        ];
        let chosen: Vec<&str> = approve_all(&c, &tasks)
            .unwrap()
            .iter()
            .map(|t| t.spec.node_name.as_str())
            .collect();
        assert_eq!(chosen, ["n2", "n3"]);
        assert_eq!(
            approve_all(&c, &tasks[..1]),
            Err(Refusal::NothingToApprove { op: "op1".into() })
        );
    }

    #[test]
    fn pause_and_resume_check_the_flag() {
        let mut o = op(ExecutionMode::Auto, OperationPhase::Running);
        assert_eq!(pause(&o), Ok(()));
        assert_eq!(resume(&o), Err(Refusal::NotPaused { op: "op1".into() }));
        o.spec.paused = true;
        assert_eq!(resume(&o), Ok(()));
        let e = pause(&o).unwrap_err();
        assert!(
            e.to_string()
                .contains("already paused; resume it with `kubectl bosun resume op1`"),
            "{e}"
        );
    }

    #[test]
    fn unknown_node_lists_the_known_ones() {
        let o = op(ExecutionMode::Auto, OperationPhase::Running);
        let tasks = vec![
            task("w2", NodeTaskPhase::Pending),
            task("w1", NodeTaskPhase::Pending),
        ];
        let e = task_of(&o, &tasks, "w9").unwrap_err();
        assert_eq!(
            e.to_string(),
            "Operation op1 has no NodeTask for node w9; its nodes are: w1, w2"
        );
    }
}
