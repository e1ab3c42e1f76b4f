//! A plugin whose every text is hostile to a terminal, for the tests that drive each
//! `kubectl-bosun` command and error path through it (runtime/cli/tests/hostile_output).
//!
//! Every string it hands the host — metadata, action names and descriptions, params
//! schema, requested capabilities, check names and messages, log lines and fields,
//! progress, stderr, outcome messages and outputs, error codes and messages, a panic —
//! carries [`H`]: OSC and CSI escape sequences, a carriage return and a newline that start
//! forged lines, NUL and its neighbours, DEL, C1 controls and bidirectional overrides.
//!
//! Variants (cargo features), since one build cannot both pass the capabilities gate and
//! fail it, nor both be signable and declare a name no signature can bind:
//! - default: name `hostile`, requests only a hostile path under `/etc`;
//! - `hostile-requests`: also requests hostile commands, arguments, units and hosts;
//! - `hostile-name`: declares a hostile name and version.

use bosun_plugin_sdk::exec::Command;
use bosun_plugin_sdk::prelude::*;
use bosun_plugin_sdk::service::Action as ServiceAction;

/// What every text holds (also in runtime/cli/tests/hostile_output/mod.rs).
const H: &str = "<\x1b]0;pwned\x07\x1b[2J\x1b[1;1H\rFORGED\x00\x01\x1f\x7f\u{85}\u{9b}31m\u{202e}\u{2066}\nFORGED verified: signed by admin>";

#[cfg(not(feature = "hostile-name"))]
const NAME: &str = "hostile";
#[cfg(feature = "hostile-name")]
const NAME: &str = "hostile\x1b]0;pwned\x07\u{202e}";

#[cfg(not(feature = "hostile-name"))]
const VERSION: &str = "0.1.0";
#[cfg(feature = "hostile-name")]
const VERSION: &str = "0.1.0\x1b[2J\rFORGED";

#[derive(Deserialize)]
#[serde(tag = "action", content = "params", rename_all = "kebab-case")]
#[allow(dead_code)] // `Params` carries its params only to be deserialized.
enum Action {
    /// Passing and warning checks, logs with fields, progress, stderr, a refused command,
    /// an outcome with outputs: every text hostile.
    All(Empty),
    /// A failing check.
    FailCheck(Empty),
    /// Preflight itself fails.
    PreflightError(Empty),
    /// Run fails with a typed error.
    Error(Empty),
    /// Run panics (the host reports a trap with the plugin's stderr).
    Trap(Empty),
    /// Declares a hostile params schema; the host refuses params outside it.
    Params(ModeParams),
}

#[derive(Deserialize)]
struct Empty {}

#[derive(Deserialize)]
#[allow(dead_code)]
struct ModeParams {
    mode: String,
}

struct Hostile;

impl Plugin for Hostile {
    type Action = Action;

    fn metadata() -> Metadata {
        let empty = r#"{"type":"object"}"#;
        let schema = bosun_plugin_sdk::serde_json::json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "description": H,
            "properties": {"mode": {"description": H, "enum": [H]}},
            "required": ["mode"],
        });
        let action = |name: &str| ActionInfo::new(name, H).params_schema(empty);
        let m = Metadata::new(NAME, VERSION)
            .description(H)
            .action(action("all").idempotent())
            .action(action("fail-check"))
            .action(action("preflight-error"))
            .action(action("error"))
            .action(action("trap"))
            .action(ActionInfo::new("params", H).params_schema(schema.to_string()))
            // Declared only: its name shows in `inspect` and in unknown-action errors.
            .action(action(H))
            .reads(format!("/etc/{H}"));
        if cfg!(feature = "hostile-requests") {
            m.writes(format!("/var/lib/{H}"))
                .runs(format!("/usr/bin/{H}"), [H, "-r"])
                .controls(format!("{H}.service"), &[ServiceAction::Restart])
                .downloads_from(H)
        } else {
            m
        }
    }

    fn preflight(action: &Action) -> Result<Vec<Check>, PluginError> {
        match action {
            Action::All(_) => Ok(vec![Check::pass(H, H), Check::warn(H, H)]),
            Action::FailCheck(_) => Ok(vec![Check::pass(H, H), Check::fail(H, H)]),
            Action::PreflightError(_) => Err(PluginError::new(H, H)),
            _ => Ok(vec![]),
        }
    }

    fn run(action: Action, _ctx: &RunContext) -> Result<Outcome, PluginError> {
        info!("{H}");
        bosun_plugin_sdk::log::write(bosun_plugin_sdk::log::Level::Warn, H, &[(H, H)]);
        bosun_plugin_sdk::log::progress(1, 2, H);
        eprintln!("{H}");
        match action {
            Action::All(_) => {
                // Not granted: the host records the refusal, naming the command (it refuses
                // a NUL in a command line outright, before the grants).
                let h = H.replace('\0', "0");
                let refused = Command::new(format!("/usr/bin/{h}")).arg(&h).output();
                Ok(Outcome::changed(H)
                    .output(H, H)
                    .output("refused", refused.is_err()))
            }
            Action::Error(_) => Err(PluginError::retryable(H, H)),
            Action::Trap(_) => panic!("{H}"),
            _ => Ok(Outcome::unchanged(H)),
        }
    }
}

bosun_plugin_sdk::export_plugin!(Hostile);
