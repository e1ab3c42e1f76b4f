//! Timestamps and conditions for status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// `now` as RFC 3339 with microseconds. `metav1.Time` serializes whole seconds only; step
/// start and finish times are written with this precision instead, so the order of steps
/// that run within the same second stays visible (it still parses as a `Time`).
pub fn precise(ts: Timestamp) -> String {
    ts.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

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
    fn precise_times_keep_microseconds_and_parse_back_as_time() {
        let ts: Timestamp = "2026-01-02T03:04:05.123456789Z".parse().unwrap();
        let text = precise(ts);
        assert_eq!(text, "2026-01-02T03:04:05.123456Z");
        let back: Time = serde_json::from_value(serde_json::Value::String(text)).unwrap();
        // Microseconds kept, anything finer dropped.
        assert_eq!(back.0.subsec_nanosecond(), 123_456_000);
    }

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
