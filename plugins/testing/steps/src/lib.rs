//! `e2e-steps`: steps the operator's end-to-end tests need and no real plugin offers: a step
//! that takes a while (to pause, kill a controller or an agent during it), the same as a
//! non-idempotent action, a step that fails until a file exists (to fix a cause and retry),
//! and a step that writes a file (to prove a dry run changes nothing). `append` lies: it is
//! declared idempotent and appends a line on every run, for the conformance kit's test to
//! catch.
//!
//! Every action honours the dry run: nothing is written, and the message says what would be.
//! `sleep`, `sleep-once` and `require` return the run context's `resumed` flag as their
//! output `resumed` (`true` or `false`), so a test can see what the agent told the plugin.
//!
//! Build: `cargo build --release --target wasm32-wasip2 -p bosun-test-steps`.

use std::time::Duration;

use bosun_plugin_sdk::prelude::*;

/// The one directory the writing actions touch; the Plugin grants it read-write.
pub const STATE_DIR: &str = "/var/lib/bosun-e2e";

/// The actions with their params.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "action", content = "params", rename_all = "kebab-case")]
pub enum Action {
    /// Wait, change nothing. Declared idempotent: an interrupted run may simply run again.
    Sleep(SleepParams),
    /// Wait, then write `STATE_DIR/<marker>`. Not idempotent: an interrupted run must not
    /// run again on its own.
    SleepOnce(SleepOnceParams),
    /// Fail (retryable) unless `path` exists. Idempotent.
    Require(RequireParams),
    /// Write `content` to `STATE_DIR/<name>`. Not idempotent.
    Write(WriteParams),
    /// Append a line to `STATE_DIR/<name>`. Declared idempotent, wrongly, on purpose.
    Append(AppendParams),
}

/// Params of `sleep`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SleepParams {
    /// How long to wait, in milliseconds.
    pub millis: u64,
}

/// Params of `sleep-once`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SleepOnceParams {
    /// How long to wait, in milliseconds.
    pub millis: u64,
    /// File name (no slashes) written under [`STATE_DIR`] when the wait is over.
    pub marker: String,
}

/// Params of `require`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RequireParams {
    /// A file that must exist (inside the granted paths).
    pub path: String,
}

/// Params of `write`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WriteParams {
    /// File name (no slashes) under [`STATE_DIR`].
    pub name: String,
    /// What to write.
    pub content: String,
}

/// Params of `append`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AppendParams {
    /// File name (no slashes) under [`STATE_DIR`].
    pub name: String,
}

/// A file under [`STATE_DIR`], refusing names that would leave it.
fn state_file(name: &str) -> Result<String, PluginError> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(PluginError::new(
            "bad-name",
            format!("{name:?} must be a plain file name (no slashes)"),
        ));
    }
    Ok(format!("{STATE_DIR}/{name}"))
}

/// The plugin.
pub struct Steps;

impl Plugin for Steps {
    type Action = Action;

    fn metadata() -> Metadata {
        bosun_plugin_sdk::metadata!()
            .name("e2e-steps")
            .action(
                ActionInfo::new("sleep", "Wait, change nothing")
                    .params::<SleepParams>()
                    .idempotent(),
            )
            .action(
                ActionInfo::new(
                    "sleep-once",
                    "Wait, then write a marker file (not idempotent)",
                )
                .params::<SleepOnceParams>(),
            )
            .action(
                ActionInfo::new("require", "Fail until a file exists")
                    .params::<RequireParams>()
                    .idempotent(),
            )
            .action(
                ActionInfo::new(
                    "write",
                    "Write a file under /var/lib/bosun-e2e (not idempotent)",
                )
                .params::<WriteParams>(),
            )
            .action(
                ActionInfo::new(
                    "append",
                    "Append a line under /var/lib/bosun-e2e (declared idempotent, wrongly)",
                )
                .params::<AppendParams>()
                .idempotent(),
            )
            .reads("/etc")
            .writes(STATE_DIR)
    }

    fn preflight(action: &Action) -> Result<Vec<Check>, PluginError> {
        let check = match action {
            Action::SleepOnce(p) => state_file(&p.marker)
                .map(|f| Check::pass("marker-name", format!("would write {f}")))?,
            Action::Write(p) => {
                state_file(&p.name).map(|f| Check::pass("file-name", format!("would write {f}")))?
            }
            Action::Append(p) => state_file(&p.name)
                .map(|f| Check::pass("file-name", format!("would append to {f}")))?,
            Action::Sleep(_) | Action::Require(_) => Check::pass("params", "nothing to check"),
        };
        Ok(vec![check])
    }

    fn run(action: Action, ctx: &RunContext) -> Result<Outcome, PluginError> {
        match action {
            Action::Sleep(p) => {
                info!("sleeping {} ms", p.millis);
                std::thread::sleep(Duration::from_millis(p.millis));
                Ok(Outcome::unchanged(format!("slept {} ms", p.millis))
                    .output("resumed", ctx.resumed.to_string()))
            }
            Action::SleepOnce(p) => {
                let file = state_file(&p.marker)?;
                info!("sleeping {} ms, then writing {file}", p.millis);
                std::thread::sleep(Duration::from_millis(p.millis));
                if ctx.dry_run {
                    return Ok(Outcome::unchanged(format!(
                        "would write {file} after {} ms",
                        p.millis
                    ))
                    .output("resumed", ctx.resumed.to_string()));
                }
                bosun_plugin_sdk::fs::write(&file, b"done\n")?;
                Ok(
                    Outcome::changed(format!("slept {} ms and wrote {file}", p.millis))
                        .output("resumed", ctx.resumed.to_string()),
                )
            }
            Action::Require(p) => match bosun_plugin_sdk::fs::read_optional(&p.path)? {
                Some(_) => Ok(Outcome::unchanged(format!("{} exists", p.path))
                    .output("resumed", ctx.resumed.to_string())),
                None => Err(PluginError::retryable(
                    "missing",
                    format!("{} does not exist yet: create it, then retry", p.path),
                )),
            },
            Action::Write(p) => {
                let file = state_file(&p.name)?;
                let current = bosun_plugin_sdk::fs::read_optional(&file)?;
                if current.as_deref() == Some(p.content.as_str()) {
                    return Ok(Outcome::unchanged(format!(
                        "{file} already holds the content"
                    )));
                }
                let now =
                    current.map_or_else(|| "absent".to_owned(), |c| format!("{} bytes", c.len()));
                if ctx.dry_run {
                    return Ok(Outcome::unchanged(format!(
                        "would write {} bytes to {file} (now {now})",
                        p.content.len()
                    ))
                    .output("wouldWrite", &file));
                }
                bosun_plugin_sdk::fs::write(&file, p.content.as_bytes())?;
                Ok(Outcome::changed(format!(
                    "wrote {} bytes to {file} (was {now})",
                    p.content.len()
                ))
                .output("wrote", &file))
            }
            Action::Append(p) => {
                let file = state_file(&p.name)?;
                if ctx.dry_run {
                    return Ok(Outcome::unchanged(format!("would append a line to {file}")));
                }
                let mut text = bosun_plugin_sdk::fs::read_optional(&file)?.unwrap_or_default();
                text.push_str("ran\n");
                bosun_plugin_sdk::fs::write(&file, text.as_bytes())?;
                // The lie the kit must catch: a change reported as none.
                Ok(Outcome::unchanged(format!("appended a line to {file}")))
            }
        }
    }
}

bosun_plugin_sdk::export_plugin!(Steps);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sleep_and_require_are_idempotent() {
        let m = Steps::metadata();
        let idempotent: Vec<(&str, bool)> = m
            .actions
            .iter()
            .map(|a| (a.name.as_str(), a.idempotent))
            .collect();
        assert_eq!(
            idempotent,
            [
                ("sleep", true),
                ("sleep-once", false),
                ("require", true),
                ("write", false),
                ("append", true)
            ]
        );
    }

    #[test]
    fn state_files_stay_in_the_state_dir() {
        assert_eq!(state_file("a").unwrap(), "/var/lib/bosun-e2e/a");
        for bad in ["", "..", ".", "a/b", "/etc/passwd"] {
            assert!(state_file(bad).is_err(), "{bad}");
        }
    }
}
