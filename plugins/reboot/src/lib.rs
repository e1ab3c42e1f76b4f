//! The `reboot` plugin: asks the node's systemd to reboot it, by starting `reboot.target`
//! through a service grant.
//!
//! The plugin only asks. Whether the node came back is not something a plugin can know (it
//! does not outlive the reboot, and it cannot read the boot identity): the planner marks
//! the step `awaitNewBoot`, the agent records the node's boot identity when the step starts
//! and keeps the step Running after this plugin returns, and the agent that starts after
//! the reboot finishes the step when it finds another boot identity (docs/reboots.md).
//!
//! Starting `reboot.target` is what `systemctl reboot` does: systemd stops every unit,
//! the kubelet and the agent among them, and reboots. `systemctl start` waits for that job,
//! so the call usually never returns; when the host's systemctl timeout ends it first, the
//! reboot was still asked for and is under way, and the action says so instead of failing.
//!
//! Action `reboot` is idempotent: asking again after an attempt that was cut short (the
//! agent restarted, the node did not reboot) asks for the same reboot, and a run that finds
//! `reboot.target` already active (the reboot under way) asks for nothing and reports no
//! change. Before, preflight refused that node ("shutting down"), so the agent's re-run of
//! an interrupted step blocked the task although the reboot it wanted was happening.

use bosun_plugin_sdk::prelude::*;
use bosun_plugin_sdk::service::{self, Action as ServiceAction};

/// The unit whose start reboots the node.
pub const UNIT: &str = "reboot.target";

/// The actions with their params.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "action", content = "params", rename_all = "kebab-case")]
pub enum Action {
    /// Ask systemd to reboot the node.
    Reboot(RebootParams),
}

/// Params of `reboot` (none).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RebootParams {}

/// The plugin.
pub struct Reboot;

impl Plugin for Reboot {
    type Action = Action;

    fn metadata() -> Metadata {
        bosun_plugin_sdk::metadata!()
            .name("reboot")
            .action(
                ActionInfo::new(
                    "reboot",
                    "Ask systemd to reboot the node (start reboot.target); the step finishes when the node is back with a new boot",
                )
                .params::<RebootParams>()
                .idempotent(),
            )
            .controls(UNIT, &[ServiceAction::Start])
    }

    fn preflight(_action: &Action) -> Result<Vec<Check>, PluginError> {
        Ok(vec![match service::status(UNIT) {
            // Already under way: `run` says so and asks nothing again.
            Ok(s) => Check::pass(
                "knows-reboot-target",
                format!("{UNIT} is {}/{}", s.active_state, s.sub_state),
            ),
            Err(e) => Check::fail(
                "knows-reboot-target",
                format!("{UNIT}: {e}; the node's systemd must know reboot.target"),
            ),
        }])
    }

    fn run(action: Action, ctx: &RunContext) -> Result<Outcome, PluginError> {
        let Action::Reboot(RebootParams {}) = action;
        let node = bosun_plugin_sdk::facts::node()?;
        if ctx.dry_run {
            return Ok(Outcome::unchanged(format!(
                "would reboot {} (start {UNIT}); the step would finish when the node is back with a new boot",
                node.node_name
            )));
        }
        // A second run in the same boot (the agent restarted while the node was going
        // down) finds the reboot under way: it asks for nothing more and says so, and the
        // step waits for the new boot as after the first run.
        let now = service::status(UNIT)?;
        if now.is_active() {
            return Ok(Outcome::unchanged(format!(
                "reboot of {} already under way: {UNIT} is {}/{}; nothing asked again",
                node.node_name, now.active_state, now.sub_state
            )));
        }
        info!("asking systemd to reboot {} (start {UNIT})", node.node_name);
        let message = match service::control(UNIT, ServiceAction::Start) {
            Ok(s) => format!(
                "reboot of {} asked for: {UNIT} is {}/{}",
                node.node_name, s.active_state, s.sub_state
            ),
            // systemctl waits for the reboot job, which ends with this host.
            Err(HostError::Timeout(m)) => format!(
                "reboot of {} asked for: systemd is still carrying it out ({m})",
                node.node_name
            ),
            Err(e) => return Err(e.into()),
        };
        Ok(Outcome::changed(message))
    }
}

bosun_plugin_sdk::export_plugin!(Reboot);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_requests_only_the_start_of_reboot_target() {
        let m = Reboot::metadata();
        assert_eq!(m.name, "reboot");
        assert_eq!(m.actions.len(), 1);
        assert_eq!(m.actions[0].name, "reboot");
        assert!(m.actions[0].idempotent);
        assert_eq!(m.capabilities.services.len(), 1);
        assert_eq!(m.capabilities.services[0].unit, UNIT);
        assert_eq!(m.capabilities.services[0].actions, [ServiceAction::Start]);
        assert!(
            m.capabilities.exec.is_empty()
                && m.capabilities.filesystem.is_empty()
                && m.capabilities.http.is_empty()
        );
    }

    #[test]
    fn the_planners_params_deserialize_and_others_are_refused() {
        // runtime/planner sends `reboot` with `{}`.
        let a: Result<Action, _> =
            serde_json::from_value(serde_json::json!({"action": "reboot", "params": {}}));
        assert!(matches!(a, Ok(Action::Reboot(RebootParams {}))));
        let b: Result<Action, _> = serde_json::from_value(
            serde_json::json!({"action": "reboot", "params": {"force": true}}),
        );
        assert!(b.is_err());
    }
}
