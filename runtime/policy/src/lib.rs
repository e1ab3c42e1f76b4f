//! Bosun's policy engine.
//!
//! Owns everything between a set of Rego policies and a typed [`Decision`]: compiling
//! the cluster's policies once per generation ([`PolicySet`]), evaluating them per worker
//! ([`Evaluator`]) at the three decision points of the design (operation, step,
//! capabilities), the input documents those points send ([`input`]), the requested ⊆
//! granted check ([`capabilities`]), the explanation behind `kubectl-bosun policy eval`
//! ([`explain()`]) and the test harness behind `kubectl-bosun policy test`
//! ([`test_dir`]). It knows nothing of Kubernetes: the controller and agent turn
//! `Policy` resources into [`PolicySource`]s and decisions into status and Events.
//!
//! Guarantees:
//! - **Fail closed.** A policy that does not compile makes every decision deny, whatever
//!   its enforcement, until it is fixed or deleted; a policy whose evaluation errors or
//!   exceeds [`Limits::eval_timeout`] denies that decision. The message names the policy
//!   and says it is broken.
//! - **Attribution.** Every deny, warning and audit names the policy that produced it;
//!   every decision carries the digest of the policy set that made it.
//! - **Isolation.** Each policy has its own engine: it sees only its own data and rules.

pub mod capabilities;
mod error;
mod explain;
pub mod input;
mod load;
mod set;
mod testing;

pub use error::{CompileError, PolicyError};
pub use explain::{Explanation, PolicyTrace, RuleTrace, explain};
pub use input::{CapabilitiesInput, OperationInput, StepInput};
pub use load::load_policies;
pub use set::{
    Decision, DecisionPoint, Enforcement, Evaluator, Finding, Limits, PolicySet, PolicySource,
    PolicyStatus, set_digest, source_digest,
};
pub use testing::{TestKind, TestReport, TestResult, test_dir, test_dir_with};

/// Merges `overlay` into `base`: objects key by key (recursively), anything else replaced.
pub(crate) fn merge(base: &mut serde_json::Value, overlay: &serde_json::Value) {
    match (base, overlay) {
        (serde_json::Value::Object(b), serde_json::Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(existing) => merge(existing, v),
                    None => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

impl Evaluator {
    /// The operation decision (`data.bosun.operation.deny`).
    pub fn operation(&mut self, input: &OperationInput) -> Decision {
        self.evaluate_input(DecisionPoint::Operation, input)
    }

    /// The step decision (`data.bosun.step.deny`).
    pub fn step(&mut self, input: &StepInput) -> Decision {
        self.evaluate_input(DecisionPoint::Step, input)
    }
}
