//! Where a NodeTask stands in its own list of steps. The logic lives in
//! [`bosun_planner::state`] (pure, unit-tested there); it is re-exported here for the
//! controller's and the agent's existing callers, so both keep one reading of a task.

pub use bosun_planner::state::{Progress, progress, step_status};
