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
        let check = match os_name(&p.file) {
            Ok(Source::File(_)) => Check::pass("file-readable", format!("{} is readable", p.file)),
            Ok(Source::Facts { unreadable, .. }) => Check::warn(
                "file-readable",
                format!("{unreadable}; the greeting names the OS from the node's facts instead"),
            ),
            // The check's name says what failed; its message is the error's own.
            Err(e) => Check::fail("file-readable", e.message),
        };
        Ok(vec![check])
    }

    fn run(action: Action, ctx: &RunContext) -> Result<Outcome, PluginError> {
        let Action::Greet(p) = action;
        info!("greeting the node as {}", p.name);

        bosun_plugin_sdk::log::progress(0, 2, "reading os-release");
        let pretty = match os_name(&p.file)? {
            Source::File(text) => {
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
                pretty
            }
            Source::Facts {
                pretty_name,
                unreadable,
            } => {
                warn!("{unreadable}; using the OS name of the node's facts");
                pretty_name
            }
        };

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

/// Where the OS name comes from.
enum Source {
    /// The file's text.
    File(String),
    /// The node's facts, which the host reads itself: the default file could not be read
    /// (on a Debian or RHEL node `/etc/os-release` is a symlink to `../usr/lib/os-release`,
    /// which leads out of the `/etc` grant, and the host follows no symlink out of a grant).
    Facts {
        pretty_name: String,
        unreadable: String,
    },
}

/// Reads `file`; for the default file only, falls back to the node's facts when it cannot
/// be read (os-release(5) itself says to fall back to `/usr/lib/os-release`, which the
/// host's facts do, safely).
fn os_name(file: &str) -> Result<Source, PluginError> {
    match bosun_plugin_sdk::fs::read_to_string(file) {
        Ok(text) => Ok(Source::File(text)),
        Err(e) if file == DEFAULT_FILE => {
            let unreadable = e.to_string();
            let facts = bosun_plugin_sdk::facts::node().map_err(|_| PluginError::from(e))?;
            if facts.os.pretty_name.is_empty() {
                return Err(PluginError::new(
                    "bad-os-release",
                    "the node's facts name no OS (PRETTY_NAME)".to_owned(),
                ));
            }
            Ok(Source::Facts {
                pretty_name: facts.os.pretty_name,
                unreadable,
            })
        }
        Err(e) => Err(e.into()),
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
