//! Where a NodeTask stands in its own list of steps, computed from its spec and status.
//!
//! The controller and the agent share this one reading of a task, so they agree on whose
//! turn it is: steps run strictly in spec order, a step starts only when every step before
//! it succeeded (or was skipped), and the side named by the next step's `runsOn` runs it.
//! Pure functions, no I/O.

use bosun_api::node_task::{StepPhase, StepStatus};
use bosun_api::operation::{RunsOn, Step};

/// The state of a task's step list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Every step succeeded or was skipped.
    Done,
    /// Step `index` is next; it has not started (or is to run again after a retry).
    Next { index: usize, runs_on: RunsOn },
    /// Step `index` is marked Running in status.
    Running { index: usize, runs_on: RunsOn },
    /// Step `index` failed; nothing after it may start until a person decides.
    Failed { index: usize },
}

/// The status entry of `name`, if the step has one.
pub fn step_status<'a>(statuses: &'a [StepStatus], name: &str) -> Option<&'a StepStatus> {
    statuses.iter().find(|s| s.name == name)
}

/// Reads the step list. A step without a status entry is Pending.
pub fn progress(steps: &[Step], statuses: &[StepStatus]) -> Progress {
    for (index, step) in steps.iter().enumerate() {
        let phase = step_status(statuses, &step.name).map_or(StepPhase::Pending, |s| s.phase);
        match phase {
            StepPhase::Succeeded | StepPhase::Skipped => continue,
            StepPhase::Pending => return Progress::Next { index, runs_on: step.runs_on },
            StepPhase::Running => return Progress::Running { index, runs_on: step.runs_on },
            StepPhase::Failed => return Progress::Failed { index },
        }
    }
    Progress::Done
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(name: &str, runs_on: RunsOn) -> Step {
        Step {
            name: name.into(),
            runs_on,
            plugin: (runs_on == RunsOn::Agent).then(|| "hello".into()),
            action: "greet".into(),
            params: None,
        }
    }

    fn status(name: &str, phase: StepPhase) -> StepStatus {
        StepStatus { name: name.into(), phase, ..Default::default() }
    }

    #[test]
    fn steps_run_in_spec_order_and_stop_at_the_first_unfinished_one() {
        let steps = [step("cordon", RunsOn::Controller), step("greet", RunsOn::Agent), step("uncordon", RunsOn::Controller)];
        assert_eq!(progress(&steps, &[]), Progress::Next { index: 0, runs_on: RunsOn::Controller });
        let s = [status("cordon", StepPhase::Succeeded)];
        assert_eq!(progress(&steps, &s), Progress::Next { index: 1, runs_on: RunsOn::Agent });
        let s = [status("cordon", StepPhase::Succeeded), status("greet", StepPhase::Running)];
        assert_eq!(progress(&steps, &s), Progress::Running { index: 1, runs_on: RunsOn::Agent });
        let s = [status("cordon", StepPhase::Succeeded), status("greet", StepPhase::Failed)];
        assert_eq!(progress(&steps, &s), Progress::Failed { index: 1 });
        let s = [
            status("uncordon", StepPhase::Succeeded),
            status("greet", StepPhase::Skipped),
            status("cordon", StepPhase::Succeeded),
        ];
        assert_eq!(progress(&steps, &s), Progress::Done);
    }

    #[test]
    fn a_later_step_finished_does_not_skip_an_earlier_pending_one() {
        let steps = [step("a", RunsOn::Agent), step("b", RunsOn::Agent)];
        let s = [status("b", StepPhase::Succeeded)];
        assert_eq!(progress(&steps, &s), Progress::Next { index: 0, runs_on: RunsOn::Agent });
    }

    #[test]
    fn status_entries_for_unknown_steps_are_ignored() {
        let steps = [step("a", RunsOn::Agent)];
        let s = [status("zzz", StepPhase::Failed), status("a", StepPhase::Succeeded)];
        assert_eq!(progress(&steps, &s), Progress::Done);
    }
}
