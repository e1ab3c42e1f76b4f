//! The hello example plugin: the smallest plugin that touches every kind of capability a
//! real one uses.
//!
//! Action `greet` reads a granted file (`/etc/os-release` by default), runs a granted
//! command (`/usr/bin/uname -r`), logs and reports progress, and returns what it found as
//! outputs. It only reads, so it is idempotent and never reports a change. `preflight`
//! checks that the file is readable and names the grant to add when it is not.
//!
//! Build: `cargo build --release --target wasm32-wasip2 -p bosun-plugin-hello`.

use bosun_plugin_sdk::exec::Command;
use bosun_plugin_sdk::prelude::*;

/// Where the greeting's facts come from unless the params say otherwise.
const DEFAULT_FILE: &str = "/etc/os-release";
/// The command the plugin runs; it must be granted with the argument `-r`.
const UNAME: &str = "/usr/bin/uname";

/// The actions of this plugin with their params.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "action", content = "params", rename_all = "kebab-case")]
pub enum Action {
    /// Greet the node.
    Greet(GreetParams),
}

/// Params of `greet`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GreetParams {
    /// Who is greeting.
    #[serde(default = "default_name")]
    pub name: String,
    /// An os-release style file (KEY=value lines) to read inside the granted directories.
    #[serde(default = "default_file")]
    pub file: String,
}

fn default_name() -> String {
    "bosun".to_owned()
}

fn default_file() -> String {
    DEFAULT_FILE.to_owned()
}

/// The plugin.
pub struct Hello;

impl Plugin for Hello {
    type Action = Action;

    fn metadata() -> Metadata {
        bosun_plugin_sdk::metadata!()
            .name("hello")
            .action(
                ActionInfo::new(
                    "greet",
                    "Read the node's os-release and kernel release and say hello",
                )
                .params::<GreetParams>()
                .idempotent(),
            )
            .reads("/etc")
            .runs(UNAME, ["-r"])
    }

    fn preflight(action: &Action) -> Result<Vec<Check>, PluginError> {
        let Action::Greet(p) = action;
        let check = match bosun_plugin_sdk::fs::read_to_string(&p.file) {
            Ok(_) => Check::pass("file-readable", format!("{} is readable", p.file)),
            Err(e) => Check::fail("file-readable", e.to_string()),
        };
        Ok(vec![check])
    }

    fn run(action: Action, ctx: &RunContext) -> Result<Outcome, PluginError> {
        let Action::Greet(p) = action;
        info!("greeting the node as {}", p.name);

        bosun_plugin_sdk::log::progress(0, 2, "reading os-release");
        let text = bosun_plugin_sdk::fs::read_to_string(&p.file)?;
        let pretty = os_release_value(&text, "PRETTY_NAME")
            .or_else(|| os_release_value(&text, "NAME"))
            .ok_or_else(|| {
                PluginError::new(
                    "bad-os-release",
                    format!("{} has neither PRETTY_NAME nor NAME", p.file),
                )
            })?;
        bosun_plugin_sdk::log::write(
            bosun_plugin_sdk::log::Level::Debug,
            "read os-release",
            &[("file", &p.file), ("pretty_name", &pretty)],
        );

        bosun_plugin_sdk::log::progress(1, 2, "asking the kernel release");
        let kernel = Command::new(UNAME)
            .arg("-r")
            .run()?
            .stdout_text()
            .trim()
            .to_owned();
        bosun_plugin_sdk::log::progress(2, 2, "done");

        let message = if ctx.dry_run {
            format!("would greet {pretty} (kernel {kernel}) from {}", p.name)
        } else {
            format!("hello from {} to {pretty} (kernel {kernel})", p.name)
        };
        info!("{message}");
        // Reading changes nothing, dry run or not.
        Ok(Outcome::unchanged(message)
            .output("os", pretty)
            .output("kernel", kernel))
    }
}

/// The value of `key` in os-release text, without quotes.
fn os_release_value(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches(|c| c == '"' || c == '\'').to_owned())
    })
}

bosun_plugin_sdk::export_plugin!(Hello);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release_values_are_unquoted() {
        let text = "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME='Debian 12'\nID=debian\n";
        assert_eq!(
            os_release_value(text, "PRETTY_NAME").as_deref(),
            Some("Debian 12")
        );
        assert_eq!(os_release_value(text, "ID").as_deref(), Some("debian"));
        assert_eq!(os_release_value(text, "VERSION_ID"), None);
    }

    #[test]
    fn metadata_declares_what_run_uses() {
        let m = Hello::metadata();
        assert_eq!(m.name, "hello");
        assert_eq!(m.version, env!("CARGO_PKG_VERSION"));
        assert!(m.actions[0].idempotent);
        assert!(m.actions[0].params_schema.contains("\"file\""));
        assert_eq!(m.capabilities.exec[0].command, UNAME);
        assert_eq!(m.capabilities.exec[0].args, ["-r"]);
        assert!(
            m.capabilities
                .filesystem
                .iter()
                .any(|p| DEFAULT_FILE.starts_with(&p.path) && !p.writable)
        );
    }
}
