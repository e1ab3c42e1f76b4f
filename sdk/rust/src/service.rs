//! Managing systemd units through the `service` import. Only units in the plugin's
//! service grants, and only the granted actions; `status` needs any grant for the unit.

use crate::HostError;
use crate::bindings::bosun::plugin::service as wit;

/// An action on a unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `systemctl start`.
    Start,
    /// `systemctl stop`.
    Stop,
    /// `systemctl restart`.
    Restart,
    /// `systemctl reload`.
    Reload,
}

impl Action {
    /// Lower-case name as used in grants and capability requests.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Start => "start",
            Self::Stop => "stop",
            Self::Restart => "restart",
            Self::Reload => "reload",
        }
    }
}

/// What systemd reports for a unit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitStatus {
    /// `ActiveState`: `active`, `inactive`, `failed`, ...
    pub active_state: String,
    /// `SubState`: `running`, `dead`, ...
    pub sub_state: String,
}

impl UnitStatus {
    /// True when `ActiveState` is `active`.
    #[must_use]
    pub fn is_active(&self) -> bool {
        self.active_state == "active"
    }
}

impl From<wit::UnitStatus> for UnitStatus {
    fn from(s: wit::UnitStatus) -> Self {
        Self {
            active_state: s.active_state,
            sub_state: s.sub_state,
        }
    }
}

/// Performs `action` on `unit` and returns its status after.
///
/// # Errors
/// [`HostError::NotGranted`] unless `action` is granted for `unit`; other host errors when
/// systemd fails.
pub fn control(unit: &str, action: Action) -> Result<UnitStatus, HostError> {
    let action = match action {
        Action::Start => wit::Action::Start,
        Action::Stop => wit::Action::Stop,
        Action::Restart => wit::Action::Restart,
        Action::Reload => wit::Action::Reload,
    };
    wit::control(unit, action)
        .map(UnitStatus::from)
        .map_err(HostError::from)
}

/// Restarts `unit`; see [`control`].
///
/// # Errors
/// As [`control`].
pub fn restart(unit: &str) -> Result<UnitStatus, HostError> {
    control(unit, Action::Restart)
}

/// Reads the status of `unit`.
///
/// # Errors
/// [`HostError::NotGranted`] when the plugin has no grant for `unit`.
pub fn status(unit: &str) -> Result<UnitStatus, HostError> {
    wit::status(unit)
        .map(UnitStatus::from)
        .map_err(HostError::from)
}
