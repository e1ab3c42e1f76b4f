//! Conditions for status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Sets the condition of `type_` in `conditions`, keeping its `lastTransitionTime` when its
/// status did not change (so the time says when it last changed, as the convention wants).
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let existing = conditions.iter().position(|c| c.type_ == type_);
    let last_transition_time = match existing.map(|i| &conditions[i]) {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Time(now),
    };
    let condition = Condition {
        type_: type_.to_string(),
        status,
        reason: reason.to_string(),
        message: message.to_string(),
        last_transition_time,
        observed_generation: generation,
    };
    match existing {
        Some(i) => conditions[i] = condition,
        None => conditions.push(condition),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_keeps_its_transition_time_until_its_status_changes() {
        let t0: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let t1: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let t2: Timestamp = "2026-01-01T00:02:00Z".parse().unwrap();
        let mut c = Vec::new();
        set_condition(&mut c, "Blocked", false, "NotBlocked", "", Some(1), t0);
        set_condition(
            &mut c,
            "Blocked",
            false,
            "NotBlocked",
            "still fine",
            Some(1),
            t1,
        );
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].last_transition_time.0, t0);
        assert_eq!(c[0].message, "still fine");
        set_condition(
            &mut c,
            "Blocked",
            true,
            "StepFailed",
            "greet failed",
            Some(1),
            t2,
        );
        assert_eq!(c[0].last_transition_time.0, t2);
        assert_eq!(c[0].status, "True");
    }
}
