//! What a plugin declares about itself: [`Metadata`], its actions and the capabilities
//! it requests. The agent refuses to run a plugin whose requests are not covered by the
//! administrator's grants, so declaring exactly what the code uses is part of the contract.

use crate::bindings::exports::bosun::plugin::plugin as wit;
use crate::service::Action as ServiceAction;

/// Name, version, actions and requested capabilities of a plugin. Build it with
/// [`metadata!`](crate::metadata) (name/version/description from `Cargo.toml`) or
/// [`Metadata::new`], then the builder methods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Metadata {
    /// Plugin name; must match the name the plugin was signed with.
    pub name: String,
    /// Plugin version (semver); must match the signed version.
    pub version: String,
    /// One paragraph for `kubectl bosun plugin inspect`.
    pub description: String,
    /// The actions, in the order `inspect` shows them.
    pub actions: Vec<ActionInfo>,
    /// What the plugin asks the administrator to grant.
    pub capabilities: Capabilities,
}

impl Metadata {
    /// Metadata with no actions and no capabilities.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            version: version.into(),
            description: String::new(),
            actions: Vec::new(),
            capabilities: Capabilities::default(),
        }
    }

    /// Replaces the name (the default from `metadata!()` is the crate name).
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Replaces the version.
    #[must_use]
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    /// Replaces the description.
    #[must_use]
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.description = description.into();
        self
    }

    /// Adds an action.
    #[must_use]
    pub fn action(mut self, action: ActionInfo) -> Self {
        self.actions.push(action);
        self
    }

    /// Requests read-only access to a directory (an absolute path on the node).
    #[must_use]
    pub fn reads(mut self, path: impl Into<String>) -> Self {
        self.capabilities.filesystem.push(PathRequest {
            path: path.into(),
            writable: false,
        });
        self
    }

    /// Requests read-write access to a directory (an absolute path on the node).
    #[must_use]
    pub fn writes(mut self, path: impl Into<String>) -> Self {
        self.capabilities.filesystem.push(PathRequest {
            path: path.into(),
            writable: true,
        });
        self
    }

    /// Requests running `command` (absolute path) with arguments matching `args`, one
    /// pattern per argument: a literal, `*` for any single argument, a glob such as `v1.*`,
    /// or a final `**` for any remaining arguments.
    #[must_use]
    pub fn runs<I, S>(mut self, command: impl Into<String>, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.capabilities.exec.push(CommandRequest {
            command: command.into(),
            args: args.into_iter().map(Into::into).collect(),
        });
        self
    }

    /// Requests performing `actions` on the systemd unit `unit` (for example `kubelet.service`).
    #[must_use]
    pub fn controls(mut self, unit: impl Into<String>, actions: &[ServiceAction]) -> Self {
        self.capabilities.services.push(UnitRequest {
            unit: unit.into(),
            actions: actions.to_vec(),
        });
        self
    }

    /// Requests downloads from `host` (optionally `host:port`).
    #[must_use]
    pub fn downloads_from(mut self, host: impl Into<String>) -> Self {
        self.capabilities.http.push(host.into());
        self
    }

    pub(crate) fn into_wit(self) -> wit::Metadata {
        wit::Metadata {
            name: self.name,
            version: self.version,
            abi_version: crate::ABI_VERSION.to_owned(),
            description: self.description,
            actions: self.actions.into_iter().map(ActionInfo::into_wit).collect(),
            capabilities: self.capabilities.into_wit(),
        }
    }
}

/// One action: its name, a one-line description, the JSON Schema of its params and
/// whether running it twice has the same effect as running it once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActionInfo {
    /// The action name the agent passes to `preflight` and `run`.
    pub name: String,
    /// One line for `inspect`.
    pub description: String,
    /// JSON Schema (draft 2020-12) of the params, as a JSON document.
    pub params_schema: String,
    /// True when a re-run after an interruption is safe. Defaults to false: an interrupted
    /// non-idempotent step is Blocked for a person to decide.
    pub idempotent: bool,
}

/// The schema used when an action declares none: an object with any members.
const ANY_OBJECT_SCHEMA: &str =
    r#"{"$schema":"https://json-schema.org/draft/2020-12/schema","type":"object"}"#;

impl ActionInfo {
    /// A non-idempotent action whose params schema is "any JSON object" until
    /// [`params`](Self::params) or [`params_schema`](Self::params_schema) sets it.
    pub fn new(name: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            params_schema: ANY_OBJECT_SCHEMA.to_owned(),
            idempotent: false,
        }
    }

    /// Sets the params schema from the Rust type the action deserializes its params into.
    #[cfg(feature = "schema")]
    #[must_use]
    pub fn params<T: schemars::JsonSchema>(mut self) -> Self {
        let schema = schemars::schema_for!(T);
        // A `Schema` is a JSON value; serializing it cannot fail.
        self.params_schema = serde_json::to_string(&schema).unwrap_or_default();
        self
    }

    /// Sets the params schema from a JSON Schema document written by hand.
    #[must_use]
    pub fn params_schema(mut self, schema_json: impl Into<String>) -> Self {
        self.params_schema = schema_json.into();
        self
    }

    /// Marks the action idempotent.
    #[must_use]
    pub fn idempotent(mut self) -> Self {
        self.idempotent = true;
        self
    }

    fn into_wit(self) -> wit::ActionInfo {
        wit::ActionInfo {
            name: self.name,
            description: self.description,
            params_schema: self.params_schema,
            idempotent: self.idempotent,
        }
    }
}

/// The capabilities a plugin asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// Directories, read-only or writable.
    pub filesystem: Vec<PathRequest>,
    /// Commands with argument patterns.
    pub exec: Vec<CommandRequest>,
    /// systemd units with actions.
    pub services: Vec<UnitRequest>,
    /// Download hosts.
    pub http: Vec<String>,
}

impl Capabilities {
    fn into_wit(self) -> wit::Capabilities {
        wit::Capabilities {
            filesystem: self
                .filesystem
                .into_iter()
                .map(|p| wit::PathRequest {
                    path: p.path,
                    writable: p.writable,
                })
                .collect(),
            exec: self
                .exec
                .into_iter()
                .map(|c| wit::CommandRequest {
                    command: c.command,
                    args: c.args,
                })
                .collect(),
            services: self
                .services
                .into_iter()
                .map(|u| wit::UnitRequest {
                    unit: u.unit,
                    actions: u.actions.iter().map(|a| a.as_str().to_owned()).collect(),
                })
                .collect(),
            http: self.http,
        }
    }
}

/// A directory the plugin needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathRequest {
    /// Absolute path on the node.
    pub path: String,
    /// True when the plugin writes inside it.
    pub writable: bool,
}

/// A command the plugin needs, with its argument patterns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandRequest {
    /// Absolute path of the command on the node.
    pub command: String,
    /// One pattern per argument.
    pub args: Vec<String>,
}

/// A systemd unit the plugin needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitRequest {
    /// Unit name with suffix.
    pub unit: String,
    /// Actions the plugin performs on it.
    pub actions: Vec<ServiceAction>,
}
