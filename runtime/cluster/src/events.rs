//! Kubernetes Events (events.k8s.io/v1), published the same way by the controller and the
//! agent: one reporter name per binary ([`CONTROLLER`], [`AGENT`]), notes cut to what the API
//! server accepts ([`truncate`]), and never a failed reconcile for a refused Event (it is
//! logged).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};

/// The `reportingController` of every Event the controller publishes (its own and the
/// operation policy gate's); `reportingInstance` is the replica's leader-election identity.
pub const CONTROLLER: &str = "bosun.dev/controller";
/// The `reportingController` of every Event an agent publishes; `reportingInstance` is its
/// node's name.
pub const AGENT: &str = "bosun.dev/agent";

/// The longest note the API server accepts, in bytes.
pub const MAX_NOTE_BYTES: usize = 1000;

/// Publishes Events as one reporter. Cheap to clone (the recorder is `Arc`-backed).
#[derive(Clone)]
pub struct Publisher {
    recorder: Recorder,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher").finish_non_exhaustive()
    }
}

/// One Event to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// Warning (true) or Normal.
    pub warning: bool,
    /// The stable reason people and tests filter on (`PolicyDenied`, `Started`, ...).
    pub reason: &'static str,
    /// What was being done (`PolicyGate`, `RunStep`, ...).
    pub action: &'static str,
    /// The human-readable text; cut to [`MAX_NOTE_BYTES`].
    pub note: String,
}

impl Notice {
    /// A Normal Event.
    pub fn normal(reason: &'static str, action: &'static str, note: String) -> Notice {
        Notice {
            warning: false,
            reason,
            action,
            note,
        }
    }

    /// A Warning Event.
    pub fn warning(reason: &'static str, action: &'static str, note: String) -> Notice {
        Notice {
            warning: true,
            reason,
            action,
            note,
        }
    }
}

impl Publisher {
    /// A publisher reporting as `controller` ([`CONTROLLER`] or [`AGENT`]) and `instance`.
    pub fn new(client: Client, controller: &str, instance: String) -> Publisher {
        let reporter = Reporter {
            controller: controller.to_string(),
            instance: Some(instance),
        };
        Publisher {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// Publishes `notice` about `object`. Never fails: a refused Event is logged.
    pub async fn publish<K: Resource<DynamicType = ()>>(&self, object: &K, notice: &Notice) {
        let reference: ObjectReference = object.object_ref(&());
        let event = Event {
            type_: if notice.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: notice.reason.to_string(),
            note: Some(truncate(&notice.note, MAX_NOTE_BYTES)),
            action: notice.action.to_string(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &reference).await {
            tracing::warn!(%error, object = %object.name_any(), reason = notice.reason, "could not publish an Event");
        }
    }
}

/// At most `max` bytes of `text`, cut at a character boundary, with `…` when cut.
pub fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub('…'.len_utf8());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_cut_at_a_character_boundary() {
        assert_eq!(truncate("short", 10), "short");
        let exact = "a".repeat(MAX_NOTE_BYTES);
        assert_eq!(truncate(&exact, MAX_NOTE_BYTES), exact);
        let long = "é".repeat(600);
        let cut = truncate(&long, MAX_NOTE_BYTES);
        assert!(cut.len() <= MAX_NOTE_BYTES && cut.ends_with('…'), "{cut}");
        assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
    }
}
