//! Step times.

use k8s_openapi::jiff::Timestamp;

/// `ts` as RFC 3339 with microseconds. `metav1.Time` serializes whole seconds only; step
/// start and finish times are written with this precision instead, so the order of steps
/// that run within the same second stays visible (it still parses as a `Time`).
pub fn precise(ts: Timestamp) -> String {
    ts.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

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
}
