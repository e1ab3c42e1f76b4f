//! Controller steps of running tasks, advanced in the background of the Operation's
//! reconcile.
//!
//! A reconcile of an Operation hands each running task whose next move is the controller's
//! (a cordon, a drain, an uncordon, the health gates, the task's end) to a job of its own,
//! then waits for its jobs for at most [`PASS_WAIT`]. What finished in that time the pass
//! sees as usual (the task's new state in the Operation's status, when to look again); what
//! did not goes on without it, and wakes the Operation itself when done. So a pass no longer
//! lasts as long as its slowest write: at 1,000 nodes a pass that waited for every uncordon
//! and status write took seconds, and a task whose agent finished during it waited for the
//! whole pass and the next (docs/benchmarks.md, fleet scale). At most
//! [`crate::reconcile::RUNNING_TASKS_AT_ONCE`] jobs run at a time, across Operations, in the
//! order they were handed over.
//!
//! **No task is advanced twice from one state.** A task is in flight from the moment a
//! reconcile hands it over until the controller's NodeTask store has shown the job's writes.
//! A reconcile reads which tasks are in flight *before* it reads the tasks from the store,
//! and hands over none of those. So a task that is not in flight when a reconcile looks was
//! released only after the store showed its last job's writes, and the tasks that reconcile
//! then reads include them. (Reconciles of one Operation never overlap: kube-runtime runs one
//! at a time per object, so no job of this Operation starts in between.)

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Semaphore;

/// How long a reconcile waits for the jobs it handed over before it carries on without the
/// rest (see the module documentation).
pub const PASS_WAIT: Duration = Duration::from_secs(1);

/// How long after a job failed its Operation is looked at again (as a failed reconcile is:
/// [`crate::reconcile::error_policy`]).
pub const RETRY_AFTER_ERROR: Duration = Duration::from_secs(5);

/// The tasks being advanced now, and the permits that bound how many at once.
#[derive(Debug)]
pub struct InFlight {
    tasks: Mutex<HashSet<String>>,
    pub(crate) permits: Arc<Semaphore>,
}

impl Default for InFlight {
    fn default() -> Self {
        InFlight {
            tasks: Mutex::default(),
            permits: Arc::new(Semaphore::new(crate::reconcile::RUNNING_TASKS_AT_ONCE)),
        }
    }
}

impl InFlight {
    /// The names of the tasks in flight now.
    pub fn busy(&self) -> HashSet<String> {
        self.lock().clone()
    }

    /// Marks `task` in flight; false when it already was.
    pub(crate) fn claim(&self, task: &str) -> bool {
        self.lock().insert(task.to_owned())
    }

    /// Marks `task` no longer in flight (once the store shows its job's writes).
    pub(crate) fn release(&self, task: &str) {
        self.lock().remove(task);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_is_claimed_once_until_released() {
        let f = InFlight::default();
        assert!(f.claim("a"));
        assert!(!f.claim("a"), "a task in flight is not handed over again");
        assert!(f.claim("b"));
        assert_eq!(f.busy(), HashSet::from(["a".to_string(), "b".to_string()]));
        f.release("a");
        assert!(f.claim("a"));
    }
}
