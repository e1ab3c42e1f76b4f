//! `ttlSecondsAfterFinished`: the only thing Bosun ever deletes on its own.
//!
//! A finished Operation (Succeeded or Failed) whose spec sets `ttlSecondsAfterFinished` is
//! deleted that many seconds after its `status.completionTime`; its NodeTasks go with it
//! through their owner references (the cluster's garbage collector, background
//! propagation). Without the field, or without a completion time, nothing is deleted: the
//! Operation and its tasks are the audit trail. The delete is conditional on the
//! Operation's uid, so an Operation re-created under the same name is never hit.

use std::time::Duration;

use bosun_api::operation::Operation;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, Preconditions, PropagationPolicy};
use kube::runtime::controller::Action;
use kube::{Client, ResourceExt};

use crate::error::{Error, Result};

/// What to do with a finished Operation now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ttl {
    /// Keep it (no TTL set, or no completion time recorded).
    Keep,
    /// Its time is up.
    DeleteNow,
    /// Look again after this long.
    Wait(Duration),
}

/// Decides from the completion time, the TTL and the time. Pure, and never panics.
///
/// A TTL this cannot act on keeps the Operation: a negative one (the schema refuses it),
/// or one whose due time is past the last instant a timestamp can hold (year 9999; the
/// schema caps the field at [`bosun_api::operation::MAX_TTL_SECONDS`], but an Operation
/// stored under an older CRD may carry more). Deleting is the only irreversible thing
/// Bosun does on its own, so doubt means keep.
pub fn decide(completion: Option<Timestamp>, ttl_seconds: Option<i64>, now: Timestamp) -> Ttl {
    let (Some(done), Some(ttl)) = (completion, ttl_seconds) else {
        return Ttl::Keep;
    };
    let Ok(ttl) = u64::try_from(ttl) else {
        return Ttl::Keep;
    };
    let Ok(due) = done.checked_add(Duration::from_secs(ttl)) else {
        return Ttl::Keep;
    };
    if now >= due {
        Ttl::DeleteNow
    } else {
        // Rounded up to whole seconds: a wake-up just before the due time would only look
        // again.
        let left = Duration::try_from(now.duration_until(due)).unwrap_or(Duration::ZERO);
        Ttl::Wait(Duration::from_secs(
            left.as_secs() + u64::from(left.subsec_nanos() > 0),
        ))
    }
}

/// For a finished Operation: deletes it when its TTL is up, otherwise says when to look
/// again. Not-found (already deleted) is success.
pub async fn after_finished(client: &Client, op: &Operation) -> Result<Action> {
    let completion = op
        .status
        .as_ref()
        .and_then(|s| s.completion_time.as_ref())
        .map(|t| t.0);
    match decide(
        completion,
        op.spec.ttl_seconds_after_finished,
        Timestamp::now(),
    ) {
        Ttl::Keep => Ok(Action::await_change()),
        Ttl::Wait(d) => Ok(Action::requeue(d)),
        Ttl::DeleteNow => {
            let name = op.name_any();
            let api: Api<Operation> = Api::all(client.clone());
            let params = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                preconditions: Some(Preconditions {
                    uid: op.uid(),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&name, &params).await {
                Ok(_) => {
                    tracing::info!(operation = %name, ttl = ?op.spec.ttl_seconds_after_finished, "finished Operation deleted after ttlSecondsAfterFinished")
                }
                // Gone already, or a different object now has the name (uid precondition).
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => {
                    return Err(Error::kube(format!(
                        "deleting finished Operation {name} (ttlSecondsAfterFinished)"
                    ))(e));
                }
            }
            Ok(Action::await_change())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn without_a_ttl_or_a_completion_time_nothing_is_deleted() {
        assert_eq!(decide(Some(t(0)), None, t(1_000_000)), Ttl::Keep);
        assert_eq!(decide(None, Some(0), t(1_000_000)), Ttl::Keep);
    }

    #[test]
    fn the_operation_is_deleted_once_its_ttl_has_passed_and_not_before() {
        assert_eq!(
            decide(Some(t(0)), Some(60), t(10)),
            Ttl::Wait(Duration::from_secs(50))
        );
        assert_eq!(
            decide(Some(t(0)), Some(60), t(59) + Duration::from_millis(500)),
            Ttl::Wait(Duration::from_secs(1))
        );
        assert_eq!(decide(Some(t(0)), Some(60), t(60)), Ttl::DeleteNow);
        assert_eq!(decide(Some(t(0)), Some(0), t(0)), Ttl::DeleteNow);
    }

    /// A due time past the largest timestamp (year 9999) used to panic in the addition,
    /// and so crash-loop the controller on every restart: now the Operation is kept.
    #[test]
    fn a_ttl_past_the_end_of_time_keeps_the_operation_instead_of_panicking() {
        let done = t(0);
        assert_eq!(decide(Some(done), Some(300_000_000_000), t(10)), Ttl::Keep);
        assert_eq!(decide(Some(done), Some(i64::MAX), t(10)), Ttl::Keep);
        // Just inside the range still counts down.
        let last = Timestamp::MAX.as_second() - done.as_second();
        assert!(matches!(
            decide(Some(done), Some(last), t(10)),
            Ttl::Wait(_)
        ));
        // The schema's largest value is far inside the range.
        assert_eq!(
            decide(
                Some(done),
                Some(bosun_api::operation::MAX_TTL_SECONDS),
                t(10)
            ),
            Ttl::Wait(Duration::from_secs(
                u64::try_from(bosun_api::operation::MAX_TTL_SECONDS).unwrap() - 10
            ))
        );
    }

    /// The schema refuses a negative TTL; one that got through anyway deletes nothing.
    #[test]
    fn a_negative_ttl_keeps_the_operation() {
        assert_eq!(decide(Some(t(0)), Some(-1), t(1_000_000)), Ttl::Keep);
    }
}
