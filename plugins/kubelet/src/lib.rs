//! The `kubelet` plugin: restarts the kubelet through the service grant and waits until
//! systemd reports it running again.
//!
//! Readiness is split on purpose. The plugin sees the node's systemd, not the cluster: it
//! waits until `kubelet.service` is `active`/`running` (and has stayed so across a short
//! settle period, so a kubelet that crash-loops right after start is caught). Whether the
//! Node object reports `Ready` is the controller's business: the planner puts a
//! `waitNodeReady` controller step right after `restart-kubelet` in every upgrade, and the
//! controller reads the Node's `Ready` condition through the API. A plugin cannot (no
//! network, no API credentials), and should not need to.
//!
//! Action `restart` is idempotent: restarting twice leaves the kubelet running, as once.
//! Action `status` only reads.

use std::time::{Duration, Instant};

use bosun_plugin_sdk::prelude::*;
use bosun_plugin_sdk::service::{self, Action as ServiceAction, UnitStatus};

/// The unit this plugin drives.
pub const UNIT: &str = "kubelet.service";

/// The actions with their params.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "action", content = "params", rename_all = "kebab-case")]
pub enum Action {
    /// Restart the kubelet and wait until it runs.
    Restart(RestartParams),
    /// Report the kubelet unit's state.
    Status(StatusParams),
}

/// Params of `restart`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RestartParams {
    /// Seconds to wait for `active`/`running` after the restart. Default 120.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: u64,
    /// Seconds the unit must stay running before the step counts as done (a kubelet that
    /// exits right after start, for a bad flag or config, is caught here). Default 5.
    #[serde(default = "default_settle")]
    pub settle_seconds: u64,
}

/// Params of `status` (none).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusParams {}

fn default_timeout() -> u64 {
    120
}

fn default_settle() -> u64 {
    5
}

/// How often the unit's state is polled.
const POLL: Duration = Duration::from_millis(500);

/// The plugin.
pub struct Kubelet;

impl Plugin for Kubelet {
    type Action = Action;

    fn metadata() -> Metadata {
        bosun_plugin_sdk::metadata!()
            .name("kubelet")
            .action(
                ActionInfo::new(
                    "restart",
                    "Restart kubelet.service and wait until systemd reports it running",
                )
                .params::<RestartParams>()
                .idempotent(),
            )
            .action(
                ActionInfo::new("status", "Report kubelet.service's systemd state")
                    .params::<StatusParams>()
                    .idempotent(),
            )
            .controls(UNIT, &[ServiceAction::Restart])
    }

    fn preflight(action: &Action) -> Result<Vec<Check>, PluginError> {
        let mut checks = Vec::new();
        if let Action::Restart(p) = action {
            checks.push(Check::require(
                "params",
                p.timeout_seconds > 0 && p.settle_seconds < p.timeout_seconds,
                format!(
                    "timeoutSeconds {} > settleSeconds {}",
                    p.timeout_seconds, p.settle_seconds
                ),
            ));
        }
        checks.push(match service::status(UNIT) {
            Ok(s) if s.active_state == "failed" => Check::warn(
                "unit-known",
                format!(
                    "{UNIT} is failed ({}); a restart may bring it back",
                    s.sub_state
                ),
            ),
            Ok(s) => Check::pass(
                "unit-known",
                format!("{UNIT} is {}/{}", s.active_state, s.sub_state),
            ),
            Err(e) => Check::fail("unit-known", format!("{UNIT}: {e}")),
        });
        Ok(checks)
    }

    fn run(action: Action, ctx: &RunContext) -> Result<Outcome, PluginError> {
        match action {
            Action::Status(StatusParams {}) => {
                let s = service::status(UNIT)?;
                Ok(
                    Outcome::unchanged(format!("{UNIT} is {}/{}", s.active_state, s.sub_state))
                        .output("activeState", &s.active_state)
                        .output("subState", &s.sub_state),
                )
            }
            Action::Restart(p) => restart(&p, ctx),
        }
    }
}

fn running(s: &UnitStatus) -> bool {
    s.active_state == "active" && s.sub_state == "running"
}

fn restart(p: &RestartParams, ctx: &RunContext) -> Result<Outcome, PluginError> {
    let before = service::status(UNIT)?;
    if ctx.dry_run {
        return Ok(Outcome::unchanged(format!(
            "would restart {UNIT} (now {}/{}) and wait up to {}s for it to run",
            before.active_state, before.sub_state, p.timeout_seconds
        )));
    }
    info!(
        "restarting {UNIT} (was {}/{})",
        before.active_state, before.sub_state
    );
    let after = service::restart(UNIT)?;
    let timeout = Duration::from_secs(p.timeout_seconds);
    let settle = Duration::from_secs(p.settle_seconds);
    let start = Instant::now();
    let mut last = after;
    let mut running_since: Option<Instant> = None;
    loop {
        if running(&last) {
            let since = *running_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= settle {
                break;
            }
        } else {
            if running_since.is_some() {
                warn!(
                    "{UNIT} stopped running after the restart ({}/{})",
                    last.active_state, last.sub_state
                );
            }
            running_since = None;
            if last.active_state == "failed" {
                return Err(PluginError::new(
                    "kubelet-failed",
                    format!(
                        "{UNIT} is failed ({}) after the restart; see `journalctl -u kubelet` on the node",
                        last.sub_state
                    ),
                ));
            }
        }
        if start.elapsed() >= timeout {
            return Err(PluginError::retryable(
                "kubelet-not-running",
                format!(
                    "{UNIT} is {}/{} {}s after the restart, expected active/running; see `journalctl -u kubelet` on the node",
                    last.active_state, last.sub_state, p.timeout_seconds
                ),
            ));
        }
        std::thread::sleep(POLL);
        last = service::status(UNIT)?;
    }
    bosun_plugin_sdk::log::progress(1, 1, "kubelet running");
    Ok(Outcome::changed(format!(
        "restarted {UNIT}; running after {:.1}s (Node readiness is the controller's waitNodeReady step)",
        start.elapsed().as_secs_f64()
    ))
    .output("activeState", &last.active_state)
    .output("subState", &last.sub_state))
}

bosun_plugin_sdk::export_plugin!(Kubelet);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_requests_only_the_kubelet_restart() {
        let m = Kubelet::metadata();
        assert_eq!(m.name, "kubelet");
        assert_eq!(m.actions[0].name, "restart");
        assert!(m.actions[0].idempotent);
        assert_eq!(m.capabilities.services.len(), 1);
        assert_eq!(m.capabilities.services[0].unit, UNIT);
        assert_eq!(m.capabilities.services[0].actions, [ServiceAction::Restart]);
        assert!(
            m.capabilities.exec.is_empty()
                && m.capabilities.filesystem.is_empty()
                && m.capabilities.http.is_empty()
        );
    }

    #[test]
    fn planner_params_deserialize() {
        // runtime/planner sends `restart` with `{}`.
        let a: Action =
            serde_json::from_value(serde_json::json!({"action": "restart", "params": {}})).unwrap();
        assert!(matches!(
            a,
            Action::Restart(RestartParams {
                timeout_seconds: 120,
                settle_seconds: 5
            })
        ));
    }
}
