//! The state machines of NodeTasks, steps and Operations, as transition functions, and the
//! decisions made from a task's state: whose turn its next step is ([`progress`]), what a
//! person's `recovery` does to it ([`resume`]), and whether `failurePolicy` retries it
//! automatically ([`auto_retry`]).
//!
//! The controller and agent never assign a phase directly: they apply an event here and
//! write the result, so an impossible move (a finished task starting again, a Running
//! task being "skipped") is an error they must handle rather than a silent status edit.

use bosun_api::node_task::{NodeTaskPhase, NodeTaskStatus, Recovery, StepPhase, StepStatus};
use bosun_api::operation::{FailureMode, FailurePolicy, OperationPhase, RunsOn, Step};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

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

/// Where a NodeTask stands in its own list of steps, read from its spec and status.
///
/// The controller and the agent share this one reading, so they agree whose turn a step
/// is: steps run strictly in spec order, a step starts only when every step before it
/// succeeded (or was skipped), and the side named by the next step's `runsOn` runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Every step succeeded or was skipped.
    Done,
    /// Step `index` is next; it has not started (or is to run again after a retry).
    Next { index: usize, runs_on: RunsOn },
    /// Step `index` is marked Running in status.
    Running { index: usize, runs_on: RunsOn },
    /// Step `index` failed; nothing after it may start until it is retried or skipped.
    Failed { index: usize },
}

/// The status entry of step `name`, if the step has one.
pub fn step_status<'a>(statuses: &'a [StepStatus], name: &str) -> Option<&'a StepStatus> {
    statuses.iter().find(|s| s.name == name)
}

/// Reads the step list. A step without a status entry is Pending; entries for steps not in
/// the spec are ignored.
pub fn progress(steps: &[Step], statuses: &[StepStatus]) -> Progress {
    for (index, step) in steps.iter().enumerate() {
        let phase = step_status(statuses, &step.name).map_or(StepPhase::Pending, |s| s.phase);
        match phase {
            StepPhase::Succeeded | StepPhase::Skipped => continue,
            StepPhase::Pending => {
                return Progress::Next {
                    index,
                    runs_on: step.runs_on,
                };
            }
            StepPhase::Running => {
                return Progress::Running {
                    index,
                    runs_on: step.runs_on,
                };
            }
            StepPhase::Failed => return Progress::Failed { index },
        }
    }
    Progress::Done
}

/// Who asked for a Blocked task to go on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resumer {
    /// A person set `spec.recovery`.
    Person,
    /// `failurePolicy: Retry`: automatic retry number `retry` of `limit`.
    Automatic { retry: u32, limit: u32 },
}

/// The new state of the step a recovery acts on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepChange {
    pub name: String,
    /// Pending (runs again) or Skipped.
    pub phase: StepPhase,
    /// Unchanged: a step's attempts count its runs, and the next run adds one.
    pub attempts: u32,
    /// For the step's status entry.
    pub message: String,
}

/// What to write when a Blocked task is retried or skipped: computed here, written by the
/// controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resumption {
    /// Running (Retry) or Skipped (Skip).
    pub phase: NodeTaskPhase,
    /// The task's attempts afterwards: one more for a retry.
    pub attempts: u32,
    /// The failed step, when there is one (a task can also block outside a step, for
    /// example on a health gate: then only the task moves).
    pub step: Option<StepChange>,
    /// The task's new message: what was done and by whom.
    pub message: String,
}

/// Applies `recovery` to a task: `Retry` sets the failed step back to Pending (it runs
/// again, its attempts grow by one when it starts) and the task to Running with one more
/// attempt; `Skip` marks the failed step Skipped and the task Skipped (the node is left as
/// it is, later steps never run, and the Operation moves on).
///
/// Refused (with a message saying so) unless the task is Blocked.
pub fn resume(
    steps: &[Step],
    status: &NodeTaskStatus,
    recovery: Recovery,
    by: Resumer,
) -> Result<Resumption, TransitionError> {
    let phase = task_transition(status.phase, TaskEvent::Recovery(recovery))?;
    let who = match by {
        Resumer::Person => format!("recovery {recovery:?} (set by a person)"),
        Resumer::Automatic { retry, limit } => {
            format!("failurePolicy Retry: automatic retry {retry} of {limit}")
        }
    };
    let failed = match progress(steps, &status.steps) {
        Progress::Failed { index } => Some(&steps[index]),
        _ => None,
    };
    let step = match failed {
        None => None,
        Some(step) => {
            let current = step_status(&status.steps, &step.name)
                .cloned()
                .unwrap_or_default();
            let event = match recovery {
                Recovery::Retry => StepEvent::Retry,
                Recovery::Skip => StepEvent::Skip,
            };
            let next = step_transition(current.phase, event)?;
            let message = match recovery {
                Recovery::Retry => {
                    format!("{who}: runs again after {} attempt(s)", current.attempts)
                }
                Recovery::Skip => format!("{who}: skipped after {} attempt(s)", current.attempts),
            };
            Some(StepChange {
                name: step.name.clone(),
                phase: next,
                attempts: current.attempts,
                message,
            })
        }
    };
    let at = step
        .as_ref()
        .map_or_else(String::new, |s| format!(" at step {}", s.name));
    let (attempts, message) = match recovery {
        Recovery::Retry => (
            status.attempts + 1,
            format!(
                "{who}: running again{at} (task attempt {})",
                status.attempts + 1
            ),
        ),
        Recovery::Skip => (
            status.attempts,
            format!(
                "{who}: node left as it was{at}; later steps do not run and the Operation moves on"
            ),
        ),
    };
    Ok(Resumption {
        phase,
        attempts,
        step,
        message,
    })
}

/// Default of `failurePolicy.retryLimit`.
pub const DEFAULT_RETRY_LIMIT: u32 = 3;
/// Default of `failurePolicy.backoffSeconds`.
pub const DEFAULT_BACKOFF_SECONDS: u32 = 30;

/// What `failurePolicy` says about a Blocked task now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AutoRetry {
    /// No automatic retry: the task waits for a person. `why` says so for the message
    /// (empty when the policy is `Block`, the default).
    No { why: String },
    /// Retry once `at` has come (the backoff after the step's last failure).
    Later {
        at: Timestamp,
        retry: u32,
        limit: u32,
    },
    /// Retry now, as automatic retry `retry` of `limit`.
    Now { retry: u32, limit: u32 },
}

/// Whether a Blocked task is retried automatically, and when.
///
/// Only with `mode: Retry`, only a step that failed with an error marked retryable (a
/// preflight failure, a policy denial or an interrupted non-idempotent step are not), and
/// only while the step has run at most `retryLimit` times (so it runs `retryLimit + 1`
/// times at most, manual retries included). The wait before retry `n` is
/// `backoffSeconds × 2^(n-1)` after the step last finished.
pub fn auto_retry(
    policy: &FailurePolicy,
    steps: &[Step],
    status: &NodeTaskStatus,
    now: Timestamp,
) -> AutoRetry {
    if policy.mode != FailureMode::Retry || status.phase != NodeTaskPhase::Blocked {
        return AutoRetry::No { why: String::new() };
    }
    let limit = policy.retry_limit.unwrap_or(DEFAULT_RETRY_LIMIT);
    let Progress::Failed { index } = progress(steps, &status.steps) else {
        return AutoRetry::No {
            why: "no failed step to retry".into(),
        };
    };
    let Some(step) = step_status(&status.steps, &steps[index].name) else {
        return AutoRetry::No {
            why: "no failed step to retry".into(),
        };
    };
    if !step.error.as_ref().is_some_and(|e| e.retryable) {
        return AutoRetry::No {
            why: format!(
                "step {} failed with an error that is not retryable",
                step.name
            ),
        };
    }
    let retry = step.attempts.max(1);
    if retry > limit {
        return AutoRetry::No {
            why: format!(
                "step {} ran {} times: the retry limit ({limit}) is used up",
                step.name, step.attempts
            ),
        };
    }
    let backoff = u64::from(policy.backoff_seconds.unwrap_or(DEFAULT_BACKOFF_SECONDS))
        .saturating_mul(1u64 << (retry - 1).min(20));
    let last = step.finished_at.as_ref().map_or(now, |t| t.0);
    let at = last
        .checked_add(SignedDuration::from_secs(
            i64::try_from(backoff).unwrap_or(i64::MAX),
        ))
        .unwrap_or(Timestamp::MAX);
    if at <= now {
        AutoRetry::Now { retry, limit }
    } else {
        AutoRetry::Later { at, retry, limit }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeTaskPhase as P;

    fn step(name: &str, runs_on: RunsOn) -> Step {
        Step {
            name: name.into(),
            runs_on,
            plugin: (runs_on == RunsOn::Agent).then(|| "hello".into()),
            action: "greet".into(),
            params: None,
            await_new_boot: false,
        }
    }

    fn status(name: &str, phase: StepPhase) -> StepStatus {
        StepStatus {
            name: name.into(),
            phase,
            ..Default::default()
        }
    }

    #[test]
    fn steps_run_in_spec_order_and_stop_at_the_first_unfinished_one() {
        use StepPhase as S;
        let steps = [
            step("cordon", RunsOn::Controller),
            step("greet", RunsOn::Agent),
            step("uncordon", RunsOn::Controller),
        ];
        assert_eq!(
            progress(&steps, &[]),
            Progress::Next {
                index: 0,
                runs_on: RunsOn::Controller
            }
        );
        let s = [status("cordon", S::Succeeded)];
        assert_eq!(
            progress(&steps, &s),
            Progress::Next {
                index: 1,
                runs_on: RunsOn::Agent
            }
        );
        let s = [status("cordon", S::Succeeded), status("greet", S::Running)];
        assert_eq!(
            progress(&steps, &s),
            Progress::Running {
                index: 1,
                runs_on: RunsOn::Agent
            }
        );
        let s = [status("cordon", S::Succeeded), status("greet", S::Failed)];
        assert_eq!(progress(&steps, &s), Progress::Failed { index: 1 });
        let s = [
            status("uncordon", S::Succeeded),
            status("greet", S::Skipped),
            status("cordon", S::Succeeded),
        ];
        assert_eq!(progress(&steps, &s), Progress::Done);
    }

    #[test]
    fn a_later_step_finished_does_not_skip_an_earlier_pending_one() {
        let steps = [step("a", RunsOn::Agent), step("b", RunsOn::Agent)];
        let s = [status("b", StepPhase::Succeeded)];
        assert_eq!(
            progress(&steps, &s),
            Progress::Next {
                index: 0,
                runs_on: RunsOn::Agent
            }
        );
    }

    #[test]
    fn status_entries_for_unknown_steps_are_ignored() {
        let steps = [step("a", RunsOn::Agent)];
        let s = [
            status("zzz", StepPhase::Failed),
            status("a", StepPhase::Succeeded),
        ];
        assert_eq!(progress(&steps, &s), Progress::Done);
    }

    /// A task of three steps blocked on the second, which ran `attempts` times and failed
    /// `finished` (seconds since the epoch) with `retryable`.
    fn blocked(attempts: u32, retryable: bool, finished: i64) -> (Vec<Step>, NodeTaskStatus) {
        let steps = vec![
            step("cordon", RunsOn::Controller),
            step("greet", RunsOn::Agent),
            step("uncordon", RunsOn::Controller),
        ];
        let mut failed = status("greet", StepPhase::Failed);
        failed.attempts = attempts;
        failed.finished_at = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Timestamp::from_second(finished).unwrap(),
        ));
        failed.error = Some(bosun_api::node_task::StepError {
            code: "boom".into(),
            message: "it broke".into(),
            retryable,
        });
        let mut cordon = status("cordon", StepPhase::Succeeded);
        cordon.attempts = 1;
        let st = NodeTaskStatus {
            phase: NodeTaskPhase::Blocked,
            steps: vec![cordon, failed],
            attempts: 1,
            ..Default::default()
        };
        (steps, st)
    }

    #[test]
    fn retry_puts_the_failed_step_back_to_pending_and_the_task_to_running() {
        let (steps, st) = blocked(1, false, 0);
        let r = resume(&steps, &st, Recovery::Retry, Resumer::Person).unwrap();
        assert_eq!(r.phase, NodeTaskPhase::Running);
        assert_eq!(r.attempts, 2);
        let change = r.step.unwrap();
        assert_eq!(
            (change.name.as_str(), change.phase, change.attempts),
            ("greet", StepPhase::Pending, 1)
        );
        assert!(r.message.contains("recovery Retry"), "{}", r.message);
        assert!(r.message.contains("step greet"), "{}", r.message);
        // After the write, the failed step is the next one to run: nothing after it.
        let mut after = st.clone();
        after.steps[1].phase = change.phase;
        assert_eq!(
            progress(&steps, &after.steps),
            Progress::Next {
                index: 1,
                runs_on: RunsOn::Agent
            }
        );
    }

    #[test]
    fn skip_marks_the_failed_step_and_the_task_skipped() {
        let (steps, st) = blocked(2, true, 0);
        let r = resume(&steps, &st, Recovery::Skip, Resumer::Person).unwrap();
        assert_eq!(r.phase, NodeTaskPhase::Skipped);
        assert_eq!(r.attempts, 1, "a skip is not another attempt");
        let change = r.step.unwrap();
        assert_eq!((change.phase, change.attempts), (StepPhase::Skipped, 2));
        assert!(r.message.contains("moves on"), "{}", r.message);
    }

    #[test]
    fn recovery_is_refused_unless_the_task_is_blocked() {
        let (steps, mut st) = blocked(1, true, 0);
        for phase in [
            NodeTaskPhase::Pending,
            NodeTaskPhase::AwaitingApproval,
            NodeTaskPhase::Running,
            NodeTaskPhase::Succeeded,
            NodeTaskPhase::Skipped,
            NodeTaskPhase::Invalid,
        ] {
            st.phase = phase;
            for recovery in [Recovery::Retry, Recovery::Skip] {
                assert!(
                    resume(&steps, &st, recovery, Resumer::Person).is_err(),
                    "{phase:?} {recovery:?}"
                );
            }
        }
    }

    #[test]
    fn a_task_blocked_outside_a_step_is_resumed_without_a_step_change() {
        let steps = vec![step("greet", RunsOn::Agent)];
        let st = NodeTaskStatus {
            phase: NodeTaskPhase::Blocked,
            steps: vec![status("greet", StepPhase::Succeeded)],
            attempts: 1,
            ..Default::default()
        };
        let r = resume(&steps, &st, Recovery::Retry, Resumer::Person).unwrap();
        assert_eq!(
            (r.phase, r.attempts, r.step),
            (NodeTaskPhase::Running, 2, None)
        );
    }

    fn retry_policy(limit: Option<u32>, backoff: Option<u32>) -> FailurePolicy {
        FailurePolicy {
            mode: FailureMode::Retry,
            retry_limit: limit,
            backoff_seconds: backoff,
        }
    }

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    #[test]
    fn automatic_retry_waits_a_doubling_backoff_then_stops_at_the_limit() {
        let policy = retry_policy(Some(3), Some(10));
        // First failure at t=100: retry 1 at t=110.
        let (steps, st) = blocked(1, true, 100);
        assert_eq!(
            auto_retry(&policy, &steps, &st, at(105)),
            AutoRetry::Later {
                at: at(110),
                retry: 1,
                limit: 3
            }
        );
        assert_eq!(
            auto_retry(&policy, &steps, &st, at(110)),
            AutoRetry::Now { retry: 1, limit: 3 }
        );
        // Second failure: 20 s; third: 40 s.
        let (steps, st) = blocked(2, true, 200);
        assert_eq!(
            auto_retry(&policy, &steps, &st, at(219)),
            AutoRetry::Later {
                at: at(220),
                retry: 2,
                limit: 3
            }
        );
        let (steps, st) = blocked(3, true, 300);
        assert_eq!(
            auto_retry(&policy, &steps, &st, at(340)),
            AutoRetry::Now { retry: 3, limit: 3 }
        );
        // Ran 4 times (3 retries): a person decides.
        let (steps, st) = blocked(4, true, 400);
        let AutoRetry::No { why } = auto_retry(&policy, &steps, &st, at(10_000)) else {
            panic!("retried past the limit");
        };
        assert!(why.contains("retry limit (3)"), "{why}");
    }

    #[test]
    fn automatic_retry_defaults_to_three_retries_thirty_seconds_apart() {
        let policy = retry_policy(None, None);
        let (steps, st) = blocked(1, true, 0);
        assert_eq!(
            auto_retry(&policy, &steps, &st, at(0)),
            AutoRetry::Later {
                at: at(30),
                retry: 1,
                limit: DEFAULT_RETRY_LIMIT
            }
        );
    }

    #[test]
    fn no_automatic_retry_for_block_policy_non_retryable_errors_or_unblocked_tasks() {
        let (steps, st) = blocked(1, true, 0);
        assert_eq!(
            auto_retry(&FailurePolicy::default(), &steps, &st, at(1_000)),
            AutoRetry::No { why: String::new() }
        );
        let policy = retry_policy(Some(5), Some(1));
        let (steps, st) = blocked(1, false, 0);
        let AutoRetry::No { why } = auto_retry(&policy, &steps, &st, at(1_000)) else {
            panic!("retried a non-retryable error");
        };
        assert!(why.contains("not retryable"), "{why}");
        let (steps, mut st) = blocked(1, true, 0);
        st.phase = NodeTaskPhase::Running;
        assert_eq!(
            auto_retry(&policy, &steps, &st, at(1_000)),
            AutoRetry::No { why: String::new() }
        );
    }

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
