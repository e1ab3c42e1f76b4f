//! Capability grants: what an administrator lets one plugin reach on a node.
//!
//! Grants are part of the `Plugin` resource and are also what `kubectl-bosun plugin run`
//! reads from a YAML file. Everything not listed here is denied: the host links a
//! capability only through these grants and fails closed with an error naming what is
//! missing.
//!
//! The types here are plain data (serde + JSON Schema) with no I/O, so the host, the
//! agent, the controller and the CLI all share one definition.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Everything one plugin may reach. The default grants nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Grants {
    /// Directories (inside the node's host root) preopened for the plugin.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filesystem: Vec<FilesystemGrant>,
    /// Host commands the plugin may run, each with allowed argument patterns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exec: Vec<ExecGrant>,
    /// systemd units the plugin may control, with the allowed actions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceGrant>,
    /// Hosts the plugin may download from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<HttpGrant>,
}

/// A directory inside the host root, preopened for the plugin at the same path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FilesystemGrant {
    /// Absolute path as seen on the node, for example `/etc/kubernetes/pki`. It is resolved
    /// under the agent's host root; `..` components are refused.
    pub path: String,
    /// `ReadOnly` (the default) or `ReadWrite`. In a dry run every grant is read-only,
    /// whatever this says.
    #[serde(default)]
    pub access: Access,
    /// The directory may be missing on some nodes (for example
    /// `/etc/kubernetes/manifests`, which only control-plane nodes have). A missing optional
    /// directory is not preopened, so the plugin sees it as absent; a missing directory
    /// that is not optional refuses the whole run. Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
}

/// How a granted directory may be used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Access {
    /// Read files and list directories; no creation, truncation, rename, link or removal.
    #[default]
    ReadOnly,
    /// Also create, write, rename and remove inside the directory.
    ReadWrite,
}

/// A command and the argument lists it may be run with.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecGrant {
    /// Absolute path of the command inside the host root, for example `/usr/bin/kubeadm`.
    pub command: String,
    /// Allowed argument lists. Each entry is a list of patterns matched position by position
    /// against the whole argument list; the command runs if any entry matches. An empty
    /// list of entries allows the command with no arguments only.
    ///
    /// A pattern is a glob matched against one whole argument, case-sensitively:
    /// - `*`, `?` and `[abc]` never match a `/`: `/etc/kubernetes/tmp/*` admits
    ///   `/etc/kubernetes/tmp/a.conf` but not `/etc/kubernetes/tmp/sub/a.conf`;
    /// - they never match a `.` at the start of the argument or right after a `/`
    ///   (`*` admits no `.hidden`); a literal `.` in the pattern does;
    /// - an argument starting with `-` matches only a pattern that itself starts with `-`:
    ///   `*` never admits an option, so a grant that allows options names them, for
    ///   example `--config=/etc/kubeadm/*.yaml` or `--config` followed by a path pattern;
    /// - an argument with a `..` component (between `/`s, or after `=` as in
    ///   `--config=..`) never matches a pattern that contains a `/`.
    ///
    /// A final `**` entry matches any number of remaining arguments (zero or more), each
    /// of which must be admitted by the glob `**` under the same rules: any text,
    /// including `/`, but no option, no `..` and no component starting with `.`. `**`
    /// anywhere else in an entry makes the grant invalid.
    #[serde(default)]
    pub args: Vec<Vec<String>>,
    /// Kill the command after this many seconds. Default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u32>,
    /// Cap on captured stdout and stderr, each, in bytes. Default 1 MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// The argument lists of this grant only read the node (for example
    /// `kubeadm upgrade plan`), so they may also run in a dry run. In a dry run the host runs
    /// only commands whose grant says `dryRun: true`; everything else is refused with
    /// `not-granted`. Grant the same command twice to mark some of its argument lists safe
    /// and not others. Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// The command may be missing on some nodes (the commands of the package managers of
    /// other OS families). The agent's `host-binaries` preflight check fails only for
    /// missing commands that are not optional; a plugin that runs a missing optional
    /// command gets `failed` from the host. Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
    /// What the command itself may reach, enforced by the kernel (Landlock and a seccomp
    /// filter) when the file is opened, the socket created or the signal sent, whatever
    /// its arguments say. Besides what is listed here a command may only read and execute
    /// the node's system directories (`/usr`, `/bin`, `/sbin`, `/lib*`), read a fixed list
    /// of non-secret files in `/etc` (loader cache, users and groups, name resolution,
    /// time zone, os-release, CA certificates) and `/proc`, use `/dev/null` and friends,
    /// and reach the plugin's own `filesystem` grants with the same access. It has no
    /// network, no Unix sockets, cannot change modes, owners or extended attributes of
    /// files, and can signal only the processes it started. In a dry run every path here
    /// is read-only. See docs/security.md, "The kernel boundary of a granted command".
    #[serde(default, skip_serializing_if = "CommandSandbox::is_empty")]
    pub sandbox: CommandSandbox,
}

/// The kernel-enforced allow-list of one exec grant's command (see [`ExecGrant::sandbox`]).
/// The default allows nothing beyond the base every command gets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandSandbox {
    /// Files and directories (inside the host root) the command may reach besides the
    /// plugin's filesystem grants, each with its access. A directory covers everything
    /// beneath it. Like filesystem grants, a path may not go through a symlink.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filesystem: Vec<CommandPath>,
    /// TCP ports the command may connect to, on any address. Granting any port also lets
    /// the command create IP and netlink sockets (UDP, for name resolution, is then not
    /// limited: Landlock bounds TCP only). Empty: no IP socket at all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tcp_connect: Vec<u16>,
    /// Named Unix sockets the command may connect to, for example
    /// `/run/containerd/containerd.sock`. On kernels whose Landlock cannot bound Unix
    /// socket connections by path (before Landlock ABI 9) granting any lets the command
    /// connect to every named Unix socket it can reach; the agent's confinement report
    /// says which applies. A socket such as containerd's or systemd's is root on the node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unix_sockets: Vec<String>,
    /// The command may change modes, owners and extended attributes of files
    /// (`chmod`, `chown`, `setxattr`). Landlock does not confine these, so they are
    /// refused outright unless granted, and granting them is root-equivalent: a command
    /// that may `chmod u+s` any file it can name is root. Package managers need it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub change_metadata: bool,
    /// Most processes and threads the command and everything it starts may have at once,
    /// where the node gives commands a cgroup with the `pids` controller. Default 1024.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16))]
    pub max_processes: Option<u32>,
    /// Most memory the command and everything it starts may use, in bytes, where the node
    /// gives commands a cgroup with the `memory` controller; past it the kernel kills them.
    /// Default 2 GiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16777216))]
    pub max_memory_bytes: Option<u64>,
    /// Largest file the command may write, in bytes (`RLIMIT_FSIZE`, on every node): a
    /// write past it fails. Default 8 GiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_file_bytes: Option<u64>,
}

/// [`CommandSandbox::max_processes`] when the grant sets none.
pub const DEFAULT_MAX_PROCESSES: u32 = 1024;
/// [`CommandSandbox::max_memory_bytes`] when the grant sets none.
pub const DEFAULT_MAX_MEMORY_BYTES: u64 = 2 << 30;
/// [`CommandSandbox::max_file_bytes`] when the grant sets none.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 8 << 30;

impl CommandSandbox {
    /// Whether nothing beyond the base is allowed.
    pub fn is_empty(&self) -> bool {
        self == &CommandSandbox::default()
    }
}

/// A path one granted command may reach (see [`CommandSandbox::filesystem`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandPath {
    /// Absolute path as seen on the node: a directory (covering everything below it) or a
    /// file. Resolved under the agent's host root; `..` components are refused.
    pub path: String,
    /// `ReadOnly` (the default) or `ReadWrite` (create, write, truncate, rename, link and
    /// remove; never make devices, FIFOs or sockets).
    #[serde(default)]
    pub access: Access,
    /// The command may execute files below this path (a package manager's maintainer
    /// scripts in `/var/lib/dpkg/info`). Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub execute: bool,
    /// The path may be missing on some nodes; a missing path that is not optional fails
    /// the command before it starts. Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
    /// A `ReadWrite` path that stays writable when the grant's command runs in a dry run
    /// (only on a `dryRun: true` grant). For a tool's own logs, lock files and caches and
    /// nothing else: dnf 4 opens `/var/log/dnf.log` and takes lock files in
    /// `/var/cache/dnf` and `/var/lib/dnf` before it does anything, even to list, and fails
    /// where they are read-only. What the command writes there is its dry run's change to
    /// the node. Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub writable_in_dry_run: bool,
}

/// A systemd unit and the actions allowed on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceGrant {
    /// Unit name including its suffix, for example `kubelet.service`: exactly one unit.
    /// A name containing `*`, `?`, `[`, `]` or `\` (which systemctl would expand to every
    /// matching unit), starting with `-`, or containing `/` or control characters makes
    /// the grant invalid; the unit a plugin asks for is checked the same way.
    pub unit: String,
    /// Allowed actions. `status` is always allowed on a granted unit.
    pub actions: Vec<ServiceAction>,
}

/// An action on a systemd unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ServiceAction {
    Start,
    Stop,
    Restart,
    Reload,
}

impl ServiceAction {
    /// The action as spelled in grants and in the plugin ABI (`restart`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceAction::Start => "start",
            ServiceAction::Stop => "stop",
            ServiceAction::Restart => "restart",
            ServiceAction::Reload => "reload",
        }
    }
}

/// A host the plugin may download from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpGrant {
    /// Host name, optionally with `:port`, for example `dl.k8s.io` or `127.0.0.1:8080`.
    pub host: String,
    /// Largest response body accepted, in bytes. Default 256 MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}
