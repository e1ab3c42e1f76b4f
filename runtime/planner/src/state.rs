//! The state machines of NodeTasks, steps and Operations, as transition functions.
//!
//! The controller and agent never assign a phase directly: they apply an event here and
//! write the result, so an impossible move (a finished task starting again, a Running
//! task being "skipped") is an error they must handle rather than a silent status edit.

use bosun_api::node_task::{NodeTaskPhase, Recovery, StepPhase};
use bosun_api::operation::OperationPhase;

/// Something that happens to a NodeTask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskEvent {
    /// The rollout gave the task a slot. `needs_approval` in Controlled mode when the task
    /// is not approved yet.
    TurnCame { needs_approval: bool },
    /// A person set `spec.approve: true`.
    Approved,
    /// The last step succeeded (and the health gates passed).
    StepsDone,
    /// A step failed, was refused, timed out or was interrupted, with no automatic retry
    /// left.
    StepFailed,
    /// A person set `spec.recovery`.
    Recovery(Recovery),
    /// The node disappeared after the plan was frozen.
    NodeGone,
}

/// An event that does not apply in the current phase.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error(
        "{what} is {from} and finished: it does not accept {event}; create a new Operation to do more"
    )]
    Finished {
        what: &'static str,
        from: String,
        event: String,
    },
    #[error("{what} in phase {from} cannot take {event}: {hint}")]
    NotApplicable {
        what: &'static str,
        from: String,
        event: String,
        hint: &'static str,
    },
}

fn not_applicable<P: std::fmt::Debug, E: std::fmt::Debug>(
    what: &'static str,
    from: P,
    event: E,
    hint: &'static str,
) -> TransitionError {
    TransitionError::NotApplicable {
        what,
        from: format!("{from:?}"),
        event: format!("{event:?}"),
        hint,
    }
}

/// The NodeTask phase after `event`.
///
/// ```text
/// Pending ──TurnCame{approval}──▶ AwaitingApproval ──Approved──▶ Running
/// Pending ──TurnCame{no approval}──────────────────────────────▶ Running
/// Running ──StepsDone──▶ Succeeded        Running ──StepFailed──▶ Blocked
/// Blocked ──Recovery(Retry)──▶ Running    Blocked ──Recovery(Skip)──▶ Skipped
/// any unfinished ──NodeGone──▶ Invalid
/// ```
pub fn task_transition(
    from: NodeTaskPhase,
    event: TaskEvent,
) -> Result<NodeTaskPhase, TransitionError> {
    use NodeTaskPhase as P;
    use TaskEvent as E;
    if from.is_finished() {
        return Err(TransitionError::Finished {
            what: "the NodeTask",
            from: format!("{from:?}"),
            event: format!("{event:?}"),
        });
    }
    match (from, event) {
        (_, E::NodeGone) => Ok(P::Invalid),
        (
            P::Pending,
            E::TurnCame {
                needs_approval: true,
            },
        ) => Ok(P::AwaitingApproval),
        (
            P::Pending,
            E::TurnCame {
                needs_approval: false,
            },
        ) => Ok(P::Running),
        (P::AwaitingApproval, E::Approved) => Ok(P::Running),
        (P::Running, E::StepsDone) => Ok(P::Succeeded),
        (P::Running, E::StepFailed) => Ok(P::Blocked),
        (P::Blocked, E::Recovery(Recovery::Retry)) => Ok(P::Running),
        (P::Blocked, E::Recovery(Recovery::Skip)) => Ok(P::Skipped),
        (P::Pending | P::AwaitingApproval | P::Running, E::Recovery(_)) => Err(not_applicable(
            "the NodeTask",
            from,
            event,
            "recovery applies only to a Blocked task; clear spec.recovery",
        )),
        (_, E::Approved) => Err(not_applicable(
            "the NodeTask",
            from,
            event,
            "approval applies only to a task awaiting approval",
        )),
        _ => Err(not_applicable(
            "the NodeTask",
            from,
            event,
            "this is a controller bug; the task keeps its phase",
        )),
    }
}

/// Something that happens to one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepEvent {
    Start,
    Succeeded,
    Failed,
    /// Run a failed step again (automatic retry or `recovery: Retry`).
    Retry,
    /// Give up on the step (`recovery: Skip` skips the failed step and every later one).
    Skip,
    /// The agent restarted while the step was running.
    AgentRestarted {
        idempotent: bool,
    },
}

/// The step phase after `event`.
///
/// After an agent restart a Running step goes back to Pending (run again) if the plugin
/// declared the action idempotent, and to Failed (the task blocks as Interrupted, for a
/// person to decide) if not: a non-idempotent step never runs twice on its own.
pub fn step_transition(from: StepPhase, event: StepEvent) -> Result<StepPhase, TransitionError> {
    use StepEvent as E;
    use StepPhase as P;
    match (from, event) {
        (P::Pending, E::Start) => Ok(P::Running),
        (P::Running, E::Succeeded) => Ok(P::Succeeded),
        (P::Running, E::Failed) => Ok(P::Failed),
        (P::Running, E::AgentRestarted { idempotent: true }) => Ok(P::Pending),
        (P::Running, E::AgentRestarted { idempotent: false }) => Ok(P::Failed),
        (P::Failed, E::Retry) => Ok(P::Pending),
        (P::Pending | P::Failed, E::Skip) => Ok(P::Skipped),
        (P::Succeeded | P::Skipped, _) => Err(TransitionError::Finished {
            what: "the step",
            from: format!("{from:?}"),
            event: format!("{event:?}"),
        }),
        _ => Err(not_applicable(
            "the step",
            from,
            event,
            "the step keeps its phase",
        )),
    }
}

/// The Operation phase to write, given the stored one and the one [`crate::schedule()`]
/// computed: Succeeded and Failed are final, so a finished Operation never moves again
/// (even if, say, a NodeTask were edited afterwards).
pub fn operation_transition(stored: OperationPhase, computed: OperationPhase) -> OperationPhase {
    if stored.is_finished() {
        stored
    } else {
        computed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeTaskPhase as P;

    const TASK_PHASES: [NodeTaskPhase; 7] = [
        P::Pending,
        P::AwaitingApproval,
        P::Running,
        P::Blocked,
        P::Succeeded,
        P::Skipped,
        P::Invalid,
    ];
    const TASK_EVENTS: [TaskEvent; 8] = [
        TaskEvent::TurnCame {
            needs_approval: true,
        },
        TaskEvent::TurnCame {
            needs_approval: false,
        },
        TaskEvent::Approved,
        TaskEvent::StepsDone,
        TaskEvent::StepFailed,
        TaskEvent::Recovery(Recovery::Retry),
        TaskEvent::Recovery(Recovery::Skip),
        TaskEvent::NodeGone,
    ];

    /// The full transition table: every (phase, event) pair, with the expected result.
    #[test]
    fn task_transition_table() {
        use TaskEvent as E;
        let expected = |from: P, ev: E| -> Option<P> {
            match (from, ev) {
                (P::Succeeded | P::Skipped | P::Invalid, _) => None,
                (_, E::NodeGone) => Some(P::Invalid),
                (
                    P::Pending,
                    E::TurnCame {
                        needs_approval: true,
                    },
                ) => Some(P::AwaitingApproval),
                (
                    P::Pending,
                    E::TurnCame {
                        needs_approval: false,
                    },
                ) => Some(P::Running),
                (P::AwaitingApproval, E::Approved) => Some(P::Running),
                (P::Running, E::StepsDone) => Some(P::Succeeded),
                (P::Running, E::StepFailed) => Some(P::Blocked),
                (P::Blocked, E::Recovery(Recovery::Retry)) => Some(P::Running),
                (P::Blocked, E::Recovery(Recovery::Skip)) => Some(P::Skipped),
                _ => None,
            }
        };
        let mut allowed = 0;
        for from in TASK_PHASES {
            for ev in TASK_EVENTS {
                let got = task_transition(from, ev);
                assert_eq!(
                    got.clone().ok(),
                    expected(from, ev),
                    "{from:?} + {ev:?} gave {got:?}"
                );
                if got.is_ok() {
                    allowed += 1;
                }
            }
        }
        // 4 unfinished phases × NodeGone + 7 named moves.
        assert_eq!(allowed, 11);
    }

    #[test]
    fn finished_tasks_never_move_and_say_why() {
        for from in [P::Succeeded, P::Skipped, P::Invalid] {
            for ev in TASK_EVENTS {
                let err = task_transition(from, ev).unwrap_err();
                assert!(
                    matches!(err, TransitionError::Finished { .. }),
                    "{from:?} + {ev:?}: {err}"
                );
                assert!(err.to_string().contains("finished"));
            }
        }
    }

    #[test]
    fn recovery_on_a_task_that_is_not_blocked_is_refused_with_a_hint() {
        let err = task_transition(P::Running, TaskEvent::Recovery(Recovery::Skip)).unwrap_err();
        assert!(
            err.to_string()
                .contains("recovery applies only to a Blocked task"),
            "{err}"
        );
    }

    /// Walk every path through the machine from Pending for a few events: a task only
    /// reaches Succeeded through Running, and only reaches Skipped through Blocked.
    #[test]
    fn every_path_to_a_finished_phase_goes_through_the_right_phase() {
        fn walk(path: Vec<P>, depth: usize) {
            let last = *path.last().unwrap();
            if last == P::Succeeded {
                assert_eq!(path[path.len() - 2], P::Running, "{path:?}");
            }
            if last == P::Skipped {
                assert_eq!(path[path.len() - 2], P::Blocked, "{path:?}");
            }
            if depth == 0 {
                return;
            }
            for ev in TASK_EVENTS {
                if let Ok(next) = task_transition(last, ev) {
                    let mut p = path.clone();
                    p.push(next);
                    walk(p, depth - 1);
                }
            }
        }
        walk(vec![P::Pending], 6);
    }

    #[test]
    fn step_transitions() {
        use StepEvent as E;
        use StepPhase as S;
        assert_eq!(step_transition(S::Pending, E::Start), Ok(S::Running));
        assert_eq!(step_transition(S::Running, E::Succeeded), Ok(S::Succeeded));
        assert_eq!(step_transition(S::Running, E::Failed), Ok(S::Failed));
        assert_eq!(step_transition(S::Failed, E::Retry), Ok(S::Pending));
        assert_eq!(step_transition(S::Failed, E::Skip), Ok(S::Skipped));
        assert_eq!(step_transition(S::Pending, E::Skip), Ok(S::Skipped));
        // The interrupted-step rule.
        assert_eq!(
            step_transition(S::Running, E::AgentRestarted { idempotent: true }),
            Ok(S::Pending)
        );
        assert_eq!(
            step_transition(S::Running, E::AgentRestarted { idempotent: false }),
            Ok(S::Failed)
        );
        // Things that must not happen.
        assert!(step_transition(S::Succeeded, E::Start).is_err());
        assert!(step_transition(S::Succeeded, E::Retry).is_err());
        assert!(step_transition(S::Running, E::Start).is_err());
        assert!(step_transition(S::Running, E::Skip).is_err());
        assert!(step_transition(S::Pending, E::Succeeded).is_err());
        assert!(step_transition(S::Pending, E::Retry).is_err());
        assert!(step_transition(S::Skipped, E::Retry).is_err());
        assert!(step_transition(S::Pending, E::AgentRestarted { idempotent: true }).is_err());
    }

    #[test]
    fn finished_operations_stay_finished() {
        use OperationPhase as O;
        let all = [
            O::Pending,
            O::Running,
            O::Paused,
            O::AwaitingApproval,
            O::Blocked,
            O::Succeeded,
            O::Failed,
        ];
        for stored in all {
            for computed in all {
                let got = operation_transition(stored, computed);
                if stored.is_finished() {
                    assert_eq!(got, stored);
                } else {
                    assert_eq!(got, computed);
                }
            }
        }
    }
}
