//! The capabilities decision point: requested ⊆ granted, checked in Rust, then policy.
//!
//! [`Grants`] is `bosun_api::grants::Grants` (re-exported). The requests mirror the WIT
//! record `capabilities` that a plugin's `describe()` returns.
//!
//! The subset check is conservative: when it cannot prove that a request is covered by a
//! grant (for example a glob requested where the grant lists literals), it refuses.
//! Refusing a plugin that would have been safe costs an administrator one more grant line;
//! the opposite would run a plugin with more than it was given.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::input::{CapabilitiesInput, PluginInfo};
use crate::set::{Decision, DecisionPoint, Evaluator, Finding};

/// The grants are bosun-api's own types (plain serde data, no I/O), so the check below
/// reads exactly what the Plugin resource holds.
pub use bosun_api::grants::{
    Access, CommandPath, CommandSandbox, ExecGrant, FilesystemGrant, Grants, HttpGrant,
    ServiceAction, ServiceGrant,
};

/// What a plugin's `describe()` asks for (WIT record `capabilities`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RequestedCapabilities {
    #[serde(default)]
    pub filesystem: Vec<PathRequest>,
    #[serde(default)]
    pub exec: Vec<CommandRequest>,
    #[serde(default)]
    pub services: Vec<UnitRequest>,
    /// Host names, optionally with `:port`.
    #[serde(default)]
    pub http: Vec<String>,
}

impl RequestedCapabilities {
    /// The requests as the plugin host reports a plugin's `describe()` (bosun-host's
    /// `Capabilities`: (path, writable), (command, argument patterns), (unit, actions),
    /// hosts). The agent and `kubectl-bosun plugin run` both build the capabilities input
    /// through this, so both judge a plugin by the same requests.
    pub fn from_parts(
        filesystem: &[(String, bool)],
        exec: &[(String, Vec<String>)],
        services: &[(String, Vec<String>)],
        http: &[String],
    ) -> RequestedCapabilities {
        RequestedCapabilities {
            filesystem: filesystem
                .iter()
                .map(|(path, writable)| PathRequest {
                    path: path.clone(),
                    writable: *writable,
                })
                .collect(),
            exec: exec
                .iter()
                .map(|(command, args)| CommandRequest {
                    command: command.clone(),
                    args: args.clone(),
                })
                .collect(),
            services: services
                .iter()
                .map(|(unit, actions)| UnitRequest {
                    unit: unit.clone(),
                    actions: actions.clone(),
                })
                .collect(),
            http: http.to_vec(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PathRequest {
    pub path: String,
    pub writable: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CommandRequest {
    pub command: String,
    /// Argument patterns, position by position: literals, `*`, globs, a final `**`.
    pub args: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UnitRequest {
    pub unit: String,
    pub actions: Vec<String>,
}

/// Every request not covered by a grant, one message each; empty when requested ⊆ granted.
pub fn uncovered(requested: &RequestedCapabilities, grants: &Grants) -> Vec<String> {
    let mut out = Vec::new();
    for r in &requested.filesystem {
        let covered = normal_path(&r.path).is_some_and(|want| {
            grants.filesystem.iter().any(|g| {
                normal_path(&g.path).is_some_and(|have| want.starts_with(&have))
                    && (!r.writable || g.access == Access::ReadWrite)
            })
        });
        if !covered {
            out.push(format!(
                "filesystem: {} ({}) is requested but no grant covers it; grant a directory containing it{}",
                r.path,
                if r.writable { "read-write" } else { "read-only" },
                if r.writable { " with access ReadWrite" } else { "" }
            ));
        }
    }
    for r in &requested.exec {
        let covered = grants
            .exec
            .iter()
            .filter(|g| g.command == r.command)
            .any(|g| {
                // No argument lists in a grant allows the command without arguments only.
                (g.args.is_empty() && r.args.is_empty())
                    || g.args.iter().any(|allowed| args_cover(allowed, &r.args))
            });
        if !covered {
            out.push(format!(
                "exec: {} {} is requested but no exec grant for that command allows those arguments",
                r.command,
                r.args.join(" ")
            ));
        }
    }
    for r in &requested.services {
        let grant = grants.services.iter().find(|g| g.unit == r.unit);
        for action in &r.actions {
            let ok = action == "status"
                || grant.is_some_and(|g| g.actions.iter().any(|a| a.as_str() == action));
            if !ok {
                out.push(format!(
                    "services: {action} on {} is requested but not granted",
                    r.unit
                ));
            }
        }
        if r.actions.is_empty() && grant.is_none() {
            out.push(format!("services: {} is requested but not granted", r.unit));
        }
    }
    for host in &requested.http {
        if !grants
            .http
            .iter()
            .any(|g| g.host.eq_ignore_ascii_case(host))
        {
            out.push(format!("http: {host} is requested but not granted"));
        }
    }
    out
}

/// An absolute path with `.` removed; `None` for relative paths or any `..`, which no
/// grant can be proven to cover.
fn normal_path(p: &str) -> Option<Vec<String>> {
    let path = Path::new(p);
    if !path.is_absolute() {
        return None;
    }
    let mut parts = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(s) => parts.push(s.to_str()?.to_owned()),
            Component::ParentDir | Component::Prefix(_) => return None,
        }
    }
    Some(parts)
}

fn is_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Whether the granted pattern list covers every argument list the requested one can
/// match.
fn args_cover(granted: &[String], requested: &[String]) -> bool {
    let g_rest = granted.last().is_some_and(|l| l == "**");
    let r_rest = requested.last().is_some_and(|l| l == "**");
    let g_fixed = &granted[..granted.len() - usize::from(g_rest)];
    let r_fixed = &requested[..requested.len() - usize::from(r_rest)];
    if r_rest && !g_rest {
        return false;
    }
    if g_rest {
        if r_fixed.len() < g_fixed.len() {
            return false;
        }
    } else if r_fixed.len() != g_fixed.len() {
        return false;
    }
    // Positions past the grant's fixed part are covered by its `**`.
    g_fixed
        .iter()
        .zip(r_fixed)
        .all(|(g, r)| pattern_covers(g, r))
}

fn pattern_covers(granted: &str, requested: &str) -> bool {
    if granted == requested || granted == "*" {
        return true;
    }
    if is_glob(requested) {
        // Glob inclusion in general is not decided here: refuse.
        return false;
    }
    glob::Pattern::new(granted).is_ok_and(|p| p.matches(requested))
}

/// The command the host itself runs for a plugin besides its exec grants: `systemctl` for
/// its service grants (the systemctl backend starts `/usr/bin/systemctl` under the host
/// root as the agent).
const SYSTEMCTL: &str = "/usr/bin/systemctl";

/// Where an administrator accepts a root-equivalent plugin by name: the data key of the
/// shipped policy `policies/root-equivalent-grants`, a list of plugin names. Every
/// root-equivalent finding names it.
pub const ROOT_EQUIVALENT_ALLOW_LIST: &str = "root_equivalent_grants.allowed_plugins";

/// A kind of place on a node whose writer is root: root runs what it holds, or what it
/// names, or lets someone in as root because of it, without the plugin doing anything
/// more than writing there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SensitivePlace {
    /// What the place is, in a finding: "… reaches /etc/cron.d ({what}): {why}".
    pub what: &'static str,
    /// Why writing there is root.
    pub why: &'static str,
    /// Absolute paths on the node. A writable path reaches one when it is the path, an
    /// ancestor or a descendant of it (a write beneath `/etc/systemd` is a unit drop-in).
    pub paths: &'static [&'static str],
}

/// The node's places whose writer is root ([`root_equivalent`]). The Rego twin in
/// `policies/root-equivalent-grants/policy.rego` holds the same table (`table`); a test
/// checks they agree.
///
/// A place is listed when root, without anything more from the plugin, runs code from
/// it, runs what it names, or lets someone in as root because of it, at a moment the
/// plugin need not cause itself: every program start (the loader), every command the
/// host runs (`PATH`), the kubelet's or systemd's next start (any plugin's restart, or a
/// reboot), cron's next minute, the next login, the next package install. The
/// kubelet's files count without a restart grant of the same plugin: the shipped
/// `kubelet` plugin, or a reboot, restarts it for anyone. The control plane's CAs and
/// etcd's data are here because a write there is root on every node once the API server
/// or etcd restarts. Reading secrets (`/etc/kubernetes/admin.conf`, the CA keys) is also
/// root-equivalent with a way to the API server, but this table is about writes only.
pub const SENSITIVE_PLACES: &[SensitivePlace] = &[
    SensitivePlace {
        what: "the node's programs",
        why: "the host starts every command with PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin, so a program written there replaces one that a command runs by name (a script's tools, apt's dpkg), and the node's services and administrators run the same programs as root",
        paths: &[
            "/usr/local/sbin",
            "/usr/local/bin",
            "/usr/sbin",
            "/usr/bin",
            "/sbin",
            "/bin",
            "/usr/libexec",
            "/usr/local/libexec",
        ],
    },
    SensitivePlace {
        what: "the dynamic loader's configuration and the libraries it loads",
        why: "every program started later, the agent's next command included, loads its shared libraries and modules through them, so it runs code written there as root",
        paths: &[
            "/etc/ld.so.preload",
            "/etc/ld.so.conf",
            "/etc/ld.so.conf.d",
            "/etc/ld.so.cache",
            "/lib",
            "/lib32",
            "/lib64",
            "/libx32",
            "/usr/lib",
            "/usr/lib32",
            "/usr/lib64",
            "/usr/libx32",
            "/usr/local/lib",
        ],
    },
    SensitivePlace {
        what: "the kubelet's static Pod manifests",
        why: "the kubelet runs every Pod manifest there without asking the API server, privileged and with the node's file system mounted if the manifest says so",
        paths: &["/etc/kubernetes/manifests"],
    },
    SensitivePlace {
        what: "the kubelet's configuration, credentials and state",
        why: "the kubelet runs as root with what is there from its next start (a restart of kubelet.service by any plugin, or a reboot), and it can name another static Pod directory, another API server or a credential helper to execute",
        paths: &[
            "/var/lib/kubelet",
            "/etc/kubernetes/kubelet.conf",
            "/etc/kubernetes/bootstrap-kubelet.conf",
            "/etc/default/kubelet",
            "/etc/sysconfig/kubelet",
        ],
    },
    SensitivePlace {
        what: "the control plane's certificate authorities and state",
        why: "the API server, etcd and the kubelet trust the certificate authorities there, and etcd serves the cluster's objects from there, from their next start (a renewal's restart, an upgrade, a reboot): a CA written there signs a system:masters client certificate, and an object written there can be a privileged Pod, either of which is root on every node",
        paths: &["/etc/kubernetes/pki", "/var/lib/etcd"],
    },
    SensitivePlace {
        what: "the container runtime's configuration, plugins and images",
        why: "containerd and CRI-O run as root the runtime and CNI plugin binaries their configuration names, and privileged Pods run the images stored there",
        paths: &[
            "/etc/containerd",
            "/etc/crio",
            "/etc/containers",
            "/opt/cni/bin",
            "/var/lib/containerd",
            "/var/lib/containers",
        ],
    },
    SensitivePlace {
        what: "systemd's units, generators and drop-ins",
        why: "systemd runs what they define as root at the next boot or daemon-reload, and at once when a unit written there is started or restarted (a service grant)",
        paths: &[
            "/etc/systemd",
            "/run/systemd",
            "/lib/systemd",
            "/usr/lib/systemd",
            "/usr/local/lib/systemd",
            "/etc/init.d",
            "/etc/rc.local",
        ],
    },
    SensitivePlace {
        what: "OpenRC's init scripts, their configuration and OpenRC's own",
        why: "on an OpenRC node the agent's service actions run the service's init script as root, sourcing its conf.d file (the host refuses a service action to a plugin that can write them), and OpenRC runs them all at the next boot",
        paths: &[
            "/etc/conf.d",
            "/etc/rc.conf",
            "/etc/runlevels",
            "/usr/local/etc/init.d",
            "/usr/local/etc/conf.d",
            "/run/openrc",
        ],
    },
    SensitivePlace {
        what: "cron's tables",
        why: "cron runs the jobs there as the user they name, root included, on their schedule (every minute if they say so)",
        paths: &[
            "/etc/crontab",
            "/etc/cron.d",
            "/etc/cron.hourly",
            "/etc/cron.daily",
            "/etc/cron.weekly",
            "/etc/cron.monthly",
            "/etc/anacrontab",
            "/var/spool/cron",
        ],
    },
    SensitivePlace {
        what: "accounts, sudo and authentication",
        why: "they decide who is root and how one logs in: an account with uid 0, a known password, a sudo rule, a PAM module or an SSH key written there lets anyone in as root",
        paths: &[
            "/etc/passwd",
            "/etc/shadow",
            "/etc/group",
            "/etc/gshadow",
            "/etc/sudoers",
            "/etc/sudoers.d",
            "/etc/pam.d",
            "/etc/security",
            "/etc/ssh",
            "/root/.ssh",
        ],
    },
    SensitivePlace {
        what: "root's shell start-up files",
        why: "every root login and login shell (an administrator's, a script run with bash -l) runs them or takes its environment, LD_PRELOAD included, from them",
        paths: &[
            "/etc/profile",
            "/etc/profile.d",
            "/etc/environment",
            "/etc/bash.bashrc",
            "/etc/bashrc",
            "/root/.profile",
            "/root/.bashrc",
            "/root/.bash_profile",
            "/root/.bash_login",
        ],
    },
    SensitivePlace {
        what: "the kernel, its modules and the helpers it runs",
        why: "the node boots the kernel and loads the modules found there, and the kernel and udev run as root the helpers they name (a modprobe install command, a udev RUN rule, kernel.core_pattern, kernel.modprobe)",
        paths: &[
            "/boot",
            "/etc/modprobe.d",
            "/etc/modules-load.d",
            "/etc/modules",
            "/etc/udev",
            "/etc/sysctl.conf",
            "/etc/sysctl.d",
            "/proc/sys",
            "/sys",
        ],
    },
    SensitivePlace {
        what: "the package manager's configuration",
        why: "apt, dpkg, dnf and yum run as root with it at the next install or upgrade (unattended ones included): a hook there runs any command, and a repository marked trusted installs any package, maintainer scripts and all",
        paths: &[
            "/etc/apt",
            "/etc/dpkg",
            "/etc/yum.repos.d",
            "/etc/yum.conf",
            "/etc/yum",
            "/etc/dnf",
        ],
    },
];

/// A place of [`SENSITIVE_PLACES`] or one that only this plugin's grants make sensitive
/// (its commands, the paths its commands may execute).
struct Place {
    what: String,
    why: &'static str,
    paths: Vec<Vec<String>>,
}

/// `/` and the components of a [`normal_path`].
fn display(parts: &[String]) -> String {
    format!("/{}", parts.join("/"))
}

/// Whether one of two paths is the other or beneath it; then the deeper of the two,
/// which is what a write to `writable` can reach of `place`.
fn overlap<'a>(writable: &'a [String], place: &'a [String]) -> Option<&'a [String]> {
    if place.starts_with(writable) {
        Some(place)
    } else if writable.starts_with(place) {
        Some(writable)
    } else {
        None
    }
}

/// The places this plugin's grants make sensitive besides [`SENSITIVE_PLACES`]: the
/// commands the host runs for it, and the paths its commands may execute.
fn places_of(grants: &Grants) -> Vec<Place> {
    let mut places: Vec<Place> = SENSITIVE_PLACES
        .iter()
        .map(|p| Place {
            what: p.what.to_owned(),
            why: p.why,
            paths: p.paths.iter().filter_map(|s| normal_path(s)).collect(),
        })
        .collect();
    let commands: BTreeSet<Vec<String>> = grants
        .exec
        .iter()
        .filter_map(|g| normal_path(&g.command))
        .collect();
    if !commands.is_empty() {
        places.push(Place {
            what: "commands the host runs for the plugin".to_owned(),
            why: "the host runs them as root whenever the plugin asks, whatever the argument patterns say, so a program written in their place runs as root",
            paths: commands.into_iter().collect(),
        });
    }
    if !grants.services.is_empty() && !grants.exec.iter().any(|g| g.command == SYSTEMCTL) {
        places.push(Place {
            what: "the systemctl the host runs for the plugin's service grants".to_owned(),
            why: "the host runs it as root whenever the plugin asks for a service action, so a program written in its place runs as root",
            paths: normal_path(SYSTEMCTL).into_iter().collect(),
        });
    }
    // Each path a command may execute, with every command that may.
    let mut executable: BTreeMap<Vec<String>, BTreeSet<&str>> = BTreeMap::new();
    for g in &grants.exec {
        for p in g.sandbox.filesystem.iter().filter(|p| p.execute) {
            if let Some(path) = normal_path(&p.path) {
                executable.entry(path).or_default().insert(&g.command);
            }
        }
    }
    for (path, commands) in executable {
        places.push(Place {
            what: format!(
                "where {} may execute files",
                commands.into_iter().collect::<Vec<_>>().join(", ")
            ),
            why: "the command runs as root, so a program written there runs as root",
            paths: vec![path],
        });
    }
    places
}

/// Units whose start reboots, powers off or halts the node: systemd's shutdown targets and
/// the services behind them. Keep equal to `shutdown_units` in
/// policies/root-equivalent-grants/policy.rego.
pub const SHUTDOWN_UNITS: &[&str] = &[
    "reboot.target",
    "soft-reboot.target",
    "kexec.target",
    "poweroff.target",
    "halt.target",
    "exit.target",
    "ctrl-alt-del.target",
    "systemd-reboot.service",
    "systemd-soft-reboot.service",
    "systemd-kexec.service",
    "systemd-poweroff.service",
    "systemd-halt.service",
    "systemd-exit.service",
];

/// The end of every finding: what to do about it.
fn remedy(plugin: &str) -> String {
    format!(
        "or, if plugin {plugin} is meant to be root on the node, name it in {ROOT_EQUIVALENT_ALLOW_LIST}"
    )
}

/// Grant sets that amount to root on the node, whatever the argument patterns say; one
/// message each, sorted.
///
/// - A writable path that reaches a place whose writer is root: one of
///   [`SENSITIVE_PLACES`], a command the host runs for the plugin (an exec grant's
///   command, `systemctl` when it has service grants), or a path one of its commands may
///   execute (`sandbox.filesystem` with `execute`). Writable means a read-write
///   filesystem grant (the plugin and all its commands write it) or a read-write path of
///   any command's sandbox (that command, running as root with `DAC_OVERRIDE`, writes
///   it). A writable path reaches a place when it is the place, an ancestor or a
///   descendant of it. One finding per writable path and kind of place, naming the
///   grants that make it writable.
/// - A command sandbox with a Unix socket: a socket such as containerd's or systemd's is
///   root, and before Landlock ABI 9 any Unix socket grant reaches every one. One
///   finding per socket.
/// - A command sandbox with `changeMetadata`: `chmod u+s` on any file it can name is
///   root. One finding for every command that has it.
///
/// Paths that are relative or go through `..` are skipped: the host refuses such grants.
///
/// The capabilities decision reports these as warnings from policy `bosun` (work goes
/// on); the shipped policy `policies/root-equivalent-grants` makes the same findings,
/// word for word, and denies them unless the plugin is named in
/// [`ROOT_EQUIVALENT_ALLOW_LIST`].
pub fn root_equivalent(plugin: &str, grants: &Grants) -> Vec<String> {
    // Each writable path with what makes it writable.
    let mut writable: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
    for g in grants
        .filesystem
        .iter()
        .filter(|g| g.access == Access::ReadWrite)
    {
        if let Some(path) = normal_path(&g.path) {
            writable
                .entry(path)
                .or_default()
                .insert("filesystem grant".to_owned());
        }
    }
    for g in &grants.exec {
        for p in g
            .sandbox
            .filesystem
            .iter()
            .filter(|p| p.access == Access::ReadWrite)
        {
            if let Some(path) = normal_path(&p.path) {
                writable
                    .entry(path)
                    .or_default()
                    .insert(format!("sandbox of exec grant {}", g.command));
            }
        }
    }
    let remedy = remedy(plugin);
    let mut out = BTreeSet::new();
    let places = places_of(grants);
    for (path, writers) in &writable {
        for place in &places {
            let reached: BTreeSet<String> = place
                .paths
                .iter()
                .filter_map(|p| overlap(path, p))
                .map(display)
                .collect();
            if reached.is_empty() {
                continue;
            }
            out.insert(format!(
                "root-equivalent grants: {} is writable ({}) and reaches {} ({}): {}. Make the grant read-only or narrower, {remedy}",
                display(path),
                writers.iter().cloned().collect::<Vec<_>>().join(", "),
                reached.into_iter().collect::<Vec<_>>().join(", "),
                place.what,
                place.why,
            ));
        }
    }
    let mut sockets: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for g in &grants.exec {
        for s in &g.sandbox.unix_sockets {
            sockets.entry(s).or_default().insert(&g.command);
        }
    }
    for (socket, commands) in sockets {
        out.insert(format!(
            "root-equivalent grants: the Unix socket {socket} is granted to {}: a socket such as containerd's or systemd's is root on the node, and before Landlock ABI 9 a Unix socket grant reaches every named Unix socket. Remove it from the sandbox, {remedy}",
            commands.into_iter().collect::<Vec<_>>().join(", "),
        ));
    }
    let metadata: BTreeSet<&str> = grants
        .exec
        .iter()
        .filter(|g| g.sandbox.change_metadata)
        .map(|g| g.command.as_str())
        .collect();
    if !metadata.is_empty() {
        out.insert(format!(
            "root-equivalent grants: changeMetadata is granted to {}: a command that may change modes and owners of any file it can name (Landlock does not confine them) can make a program set-user-ID root. Remove it from the sandbox, {remedy}",
            metadata.into_iter().collect::<Vec<_>>().join(", "),
        ));
    }
    let shutdown: BTreeSet<&str> = grants
        .services
        .iter()
        .filter(|g| SHUTDOWN_UNITS.contains(&g.unit.as_str()))
        .filter(|g| {
            g.actions
                .iter()
                .any(|a| matches!(a, ServiceAction::Start | ServiceAction::Restart))
        })
        .map(|g| g.unit.as_str())
        .collect();
    if !shutdown.is_empty() {
        out.insert(format!(
            "root-equivalent grants: a start of {} is granted: systemd then stops every Pod and service on the node at once, without a drain, and the node boots again (or stays off) with whatever kernel, units and configuration it has by then. Remove the grant, {remedy}",
            shutdown.into_iter().collect::<Vec<_>>().join(", "),
        ));
    }
    out.into_iter().collect()
}

impl Evaluator {
    /// The capabilities decision: first every request must be covered by a grant (a
    /// finding from policy `bosun` per uncovered request, and then no policy runs), then
    /// `data.bosun.capabilities.deny` of every policy judges the plugin, its requests and
    /// its grants. Root-equivalent grant sets ([`root_equivalent`]) are added as
    /// warnings from policy `bosun`, whether or not a policy (the shipped
    /// `root-equivalent-grants`) also denies them or the plugin is allowed by name there.
    pub fn capabilities(
        &mut self,
        plugin: &PluginInfo,
        requested: &RequestedCapabilities,
        grants: &Grants,
        node: Option<&str>,
    ) -> Decision {
        let missing = uncovered(requested, grants);
        if !missing.is_empty() {
            return self.with_denies(
                DecisionPoint::Capabilities,
                missing
                    .into_iter()
                    .map(|message| Finding {
                        policy: "bosun".into(),
                        message,
                    })
                    .collect(),
            );
        }
        let input = CapabilitiesInput {
            plugin: plugin.clone(),
            requested: requested.clone(),
            grants: grants.clone(),
            node: node.map(str::to_owned),
        };
        let mut decision = self.evaluate_input(DecisionPoint::Capabilities, &input);
        decision
            .warnings
            .extend(
                root_equivalent(&plugin.name, grants)
                    .into_iter()
                    .map(|message| Finding {
                        policy: "bosun".into(),
                        message,
                    }),
            );
        decision
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| (*s).to_owned()).collect()
    }

    fn exec(command: &str) -> ExecGrant {
        ExecGrant {
            command: command.into(),
            args: vec![],
            timeout_seconds: None,
            max_output_bytes: None,
            dry_run: false,
            optional: false,
            sandbox: Default::default(),
        }
    }

    fn dir(path: &str, access: Access) -> FilesystemGrant {
        FilesystemGrant {
            path: path.into(),
            access,
            optional: false,
        }
    }

    fn sandboxed(command: &str, sandbox: CommandSandbox) -> ExecGrant {
        ExecGrant {
            sandbox,
            ..exec(command)
        }
    }

    fn path(path: &str, access: Access, execute: bool) -> CommandPath {
        CommandPath {
            path: path.into(),
            access,
            execute,
            optional: false,
            writable_in_dry_run: false,
        }
    }

    /// The kind of place each finding names, among the table's and `extra`.
    fn kinds(found: &[String], extra: &[&str]) -> Vec<String> {
        let candidates: Vec<&str> = SENSITIVE_PLACES
            .iter()
            .map(|p| p.what)
            .chain(extra.iter().copied())
            .collect();
        found
            .iter()
            .map(|f| {
                candidates
                    .iter()
                    .find(|w| f.contains(&format!(" ({w}): ")))
                    .map_or_else(|| format!("? {f}"), |w| (*w).to_owned())
            })
            .collect()
    }

    #[test]
    fn a_writable_grant_over_a_command_the_plugin_runs_is_root_equivalent() {
        // A command outside the system directories: only the command rule applies.
        let grants = Grants {
            filesystem: vec![
                dir("/opt/tool", Access::ReadWrite),
                dir("/var/lib/tool", Access::ReadWrite),
            ],
            exec: vec![exec("/opt/tool/bin/run"), exec("/opt/other/bin/run")],
            ..Grants::default()
        };
        assert_eq!(
            root_equivalent("tool", &grants),
            vec![
                "root-equivalent grants: /opt/tool is writable (filesystem grant) and reaches /opt/tool/bin/run \
                 (commands the host runs for the plugin): the host runs them as root whenever the plugin asks, \
                 whatever the argument patterns say, so a program written in their place runs as root. Make the \
                 grant read-only or narrower, or, if plugin tool is meant to be root on the node, name it in \
                 root_equivalent_grants.allowed_plugins"
            ]
        );
        // Service grants make the host run systemctl.
        let services = Grants {
            filesystem: vec![dir("/usr/bin/systemctl", Access::ReadWrite)],
            services: vec![ServiceGrant {
                unit: "kubelet.service".into(),
                actions: vec![ServiceAction::Restart],
            }],
            ..Grants::default()
        };
        let found = root_equivalent("p", &services);
        assert!(
            found.iter().any(|f| f.contains(
                "reaches /usr/bin/systemctl (the systemctl the host runs for the plugin's service grants)"
            )),
            "{found:?}"
        );
        // Read-only, a sibling directory, or a prefix that is not a path component: none.
        for fs in [
            dir("/opt/tool", Access::ReadOnly),
            dir("/opt/tool2", Access::ReadWrite),
            dir("/opt/to", Access::ReadWrite),
            dir("opt/tool", Access::ReadWrite),
            dir("/opt/x/../tool", Access::ReadWrite),
        ] {
            let g = Grants {
                filesystem: vec![fs.clone()],
                exec: vec![exec("/opt/tool/bin/run")],
                ..Grants::default()
            };
            assert!(root_equivalent("p", &g).is_empty(), "{fs:?}");
        }
    }

    #[test]
    fn every_place_in_the_table_is_reached_by_itself_an_ancestor_and_a_descendant() {
        for place in SENSITIVE_PLACES {
            for p in place.paths {
                let parent = p.rsplit_once('/').unwrap().0;
                let parent = if parent.is_empty() { "/" } else { parent };
                for writable in [
                    p.to_string(),
                    format!("{p}/"),
                    format!("{p}/x"),
                    parent.to_owned(),
                ] {
                    // Granted to the plugin, or to one command's sandbox.
                    for grants in [
                        Grants {
                            filesystem: vec![dir(&writable, Access::ReadWrite)],
                            ..Grants::default()
                        },
                        Grants {
                            exec: vec![sandboxed(
                                "/usr/bin/tool",
                                CommandSandbox {
                                    filesystem: vec![path(&writable, Access::ReadWrite, false)],
                                    ..CommandSandbox::default()
                                },
                            )],
                            ..Grants::default()
                        },
                    ] {
                        let found = root_equivalent("p", &grants);
                        assert!(
                            found
                                .iter()
                                .any(|f| f.contains(&format!(" ({}): {}. ", place.what, place.why))),
                            "{writable} should reach {p} ({}): {found:?}",
                            place.what
                        );
                    }
                }
                // Read-only, at the place itself: nothing.
                let read_only = Grants {
                    filesystem: vec![dir(p, Access::ReadOnly)],
                    exec: vec![sandboxed(
                        "/usr/bin/tool",
                        CommandSandbox {
                            filesystem: vec![path(p, Access::ReadOnly, false)],
                            ..CommandSandbox::default()
                        },
                    )],
                    ..Grants::default()
                };
                assert!(root_equivalent("p", &read_only).is_empty(), "{p}");
            }
        }
    }

    #[test]
    fn writable_places_outside_the_table_are_not_root_equivalent() {
        for writable in [
            "/etc/kubernetes/manifests-old",
            "/etc/kubernetes/tmp",
            "/var/lib/kubelet-backup",
            "/var/lib/etcd-backup",
            "/var/lib/bosun-e2e",
            "/var/cache/apt",
            "/tmp",
            "/etc/cron",
            "/usr/share/doc",
            "/usr/bin2",
            "/etc/ssl/certs",
        ] {
            let grants = Grants {
                filesystem: vec![dir(writable, Access::ReadWrite)],
                exec: vec![sandboxed(
                    "/usr/bin/kubeadm",
                    CommandSandbox {
                        filesystem: vec![path(writable, Access::ReadWrite, false)],
                        tcp_connect: vec![6443],
                        ..CommandSandbox::default()
                    },
                )],
                ..Grants::default()
            };
            assert_eq!(
                root_equivalent("p", &grants),
                Vec::<String>::new(),
                "{writable}"
            );
        }
    }

    #[test]
    fn one_finding_per_writable_path_and_kind_of_place_naming_every_writer() {
        let sandbox = CommandSandbox {
            filesystem: vec![path("/etc/", Access::ReadWrite, false)],
            ..CommandSandbox::default()
        };
        let grants = Grants {
            filesystem: vec![dir("/etc", Access::ReadWrite)],
            exec: vec![
                sandboxed("/usr/bin/dnf-3", sandbox.clone()),
                sandboxed("/usr/bin/apt-get", sandbox.clone()),
                sandboxed("/usr/bin/apt-get", sandbox),
            ],
            ..Grants::default()
        };
        let found = root_equivalent("packages", &grants);
        let cron: Vec<&String> = found
            .iter()
            .filter(|f| f.contains("cron's tables"))
            .collect();
        assert_eq!(cron.len(), 1, "{found:?}");
        assert!(
            cron[0].starts_with(
                "root-equivalent grants: /etc is writable (filesystem grant, sandbox of exec grant /usr/bin/apt-get, \
                 sandbox of exec grant /usr/bin/dnf-3) and reaches /etc/anacrontab, /etc/cron.d, /etc/cron.daily, \
                 /etc/cron.hourly, /etc/cron.monthly, /etc/cron.weekly, /etc/crontab (cron's tables): "
            ),
            "{}",
            cron[0]
        );
        // Every kind of place under /etc, once each.
        let mut kinds = kinds(&found, &[]);
        kinds.sort();
        let mut want: Vec<String> = SENSITIVE_PLACES
            .iter()
            .filter(|p| p.paths.iter().any(|p| p.starts_with("/etc/")))
            .map(|p| p.what.to_owned())
            .collect();
        want.sort();
        assert_eq!(kinds, want);
        // A descendant of a place reaches itself, not the whole place.
        let drop_in = Grants {
            filesystem: vec![dir(
                "/etc/systemd/system/kubelet.service.d",
                Access::ReadWrite,
            )],
            ..Grants::default()
        };
        let found = root_equivalent("p", &drop_in);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains(
                "/etc/systemd/system/kubelet.service.d is writable (filesystem grant) and reaches \
                 /etc/systemd/system/kubelet.service.d (systemd's units"
            ),
            "{}",
            found[0]
        );
    }

    #[test]
    fn unix_sockets_and_change_metadata_are_root_equivalent_by_themselves() {
        let grants = Grants {
            exec: vec![
                sandboxed(
                    "/usr/bin/kubeadm",
                    CommandSandbox {
                        unix_sockets: v(&["/run/containerd/containerd.sock"]),
                        ..CommandSandbox::default()
                    },
                ),
                sandboxed(
                    "/usr/bin/crictl",
                    CommandSandbox {
                        unix_sockets: v(&["/run/containerd/containerd.sock", "/run/other.sock"]),
                        change_metadata: true,
                        ..CommandSandbox::default()
                    },
                ),
                sandboxed(
                    "/usr/bin/apt-get",
                    CommandSandbox {
                        change_metadata: true,
                        ..CommandSandbox::default()
                    },
                ),
            ],
            ..Grants::default()
        };
        let found = root_equivalent("p", &grants);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].starts_with(
            "root-equivalent grants: changeMetadata is granted to /usr/bin/apt-get, /usr/bin/crictl: "
        ));
        assert!(found[1].starts_with(
            "root-equivalent grants: the Unix socket /run/containerd/containerd.sock is granted to \
             /usr/bin/crictl, /usr/bin/kubeadm: "
        ));
        assert!(found[2].starts_with(
            "root-equivalent grants: the Unix socket /run/other.sock is granted to /usr/bin/crictl: "
        ));
        // TCP ports are not root by themselves.
        let tcp = Grants {
            exec: vec![sandboxed(
                "/usr/bin/kubeadm",
                CommandSandbox {
                    tcp_connect: vec![6443, 2379],
                    ..CommandSandbox::default()
                },
            )],
            ..Grants::default()
        };
        assert!(root_equivalent("p", &tcp).is_empty());
    }

    #[test]
    fn a_writable_path_a_command_may_execute_is_root_equivalent() {
        let hooks = |access, execute| CommandSandbox {
            filesystem: vec![path("/var/lib/tool/hooks", access, execute)],
            ..CommandSandbox::default()
        };
        // Written by the plugin, executed by the command.
        let by_plugin = Grants {
            filesystem: vec![dir("/var/lib/tool", Access::ReadWrite)],
            exec: vec![sandboxed("/opt/bin/tool", hooks(Access::ReadOnly, true))],
            ..Grants::default()
        };
        assert_eq!(
            kinds(
                &root_equivalent("p", &by_plugin),
                &["where /opt/bin/tool may execute files"]
            ),
            vec!["where /opt/bin/tool may execute files"]
        );
        // Written and executed by the command itself.
        let by_itself = Grants {
            exec: vec![sandboxed("/opt/bin/tool", hooks(Access::ReadWrite, true))],
            ..Grants::default()
        };
        let found = root_equivalent("p", &by_itself);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains(
            "/var/lib/tool/hooks is writable (sandbox of exec grant /opt/bin/tool) and reaches \
             /var/lib/tool/hooks (where /opt/bin/tool may execute files)"
        ));
        // Written by one command, executed by another.
        let by_another = Grants {
            exec: vec![
                sandboxed("/opt/bin/tool", hooks(Access::ReadOnly, true)),
                sandboxed(
                    "/opt/bin/writer",
                    CommandSandbox {
                        filesystem: vec![path("/var/lib/tool/hooks/a", Access::ReadWrite, false)],
                        ..CommandSandbox::default()
                    },
                ),
            ],
            ..Grants::default()
        };
        assert_eq!(root_equivalent("p", &by_another).len(), 1);
        // Executable but written by nobody, or writable but executed by nobody: fine.
        for grants in [
            Grants {
                exec: vec![sandboxed("/opt/bin/tool", hooks(Access::ReadOnly, true))],
                ..Grants::default()
            },
            Grants {
                exec: vec![sandboxed("/opt/bin/tool", hooks(Access::ReadWrite, false))],
                ..Grants::default()
            },
        ] {
            assert!(root_equivalent("p", &grants).is_empty(), "{grants:?}");
        }
    }

    /// The Rego twin holds the same table of places.
    #[test]
    fn the_rego_policy_holds_the_same_table() {
        let rego = include_str!("../../../policies/root-equivalent-grants/policy.rego");
        let mut engine = crate::set::new_engine(crate::Limits::default());
        engine
            .add_policy("policy.rego".into(), rego.into())
            .unwrap();
        let table = engine
            .eval_rule("data.bosun.capabilities.root_equivalent.table".into())
            .unwrap();
        let rego_table: serde_json::Value =
            serde_json::from_str(&table.to_json_str().unwrap()).unwrap();
        assert_eq!(rego_table, serde_json::to_value(SENSITIVE_PLACES).unwrap());
    }

    /// Every case of the Rego policy's cases.yaml that does not set data (the allow-list)
    /// gives, through the Rust function, exactly the denies the case expects from the
    /// policy: one table of cases for both twins.
    #[test]
    fn rust_and_rego_agree_on_the_policy_cases() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies");
        let cases: serde_yaml::Value = serde_yaml::from_str(
            &std::fs::read_to_string(dir.join("root-equivalent-grants/cases.yaml")).unwrap(),
        )
        .unwrap();
        let base: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("schema/examples/capabilities.json")).unwrap(),
        )
        .unwrap();
        let mut compared = 0;
        for case in cases["cases"].as_sequence().unwrap() {
            if case.get("data").is_some() {
                continue;
            }
            let name = case["name"].as_str().unwrap();
            let mut input = base.clone();
            let overlay: serde_json::Value = serde_yaml::from_value(case["input"].clone()).unwrap();
            crate::merge(&mut input, &overlay);
            let input: CapabilitiesInput = serde_json::from_value(input).unwrap();
            let mut want: Vec<String> = case
                .get("denies")
                .and_then(|d| d.as_sequence())
                .map(|d| d.iter().map(|m| m.as_str().unwrap().to_owned()).collect())
                .unwrap_or_default();
            want.sort();
            assert_eq!(
                root_equivalent(&input.plugin.name, &input.grants),
                want,
                "case {name:?}"
            );
            compared += 1;
        }
        assert!(compared >= 10, "only {compared} cases compared");
    }

    #[test]
    fn args_coverage_is_conservative() {
        assert!(args_cover(
            &v(&["certs", "renew", "*"]),
            &v(&["certs", "renew", "all"])
        ));
        assert!(args_cover(
            &v(&["certs", "renew", "*"]),
            &v(&["certs", "renew", "*"])
        ));
        assert!(args_cover(
            &v(&["upgrade", "apply", "v1.*", "**"]),
            &v(&["upgrade", "apply", "v1.34.2", "--yes"])
        ));
        assert!(args_cover(&v(&["upgrade", "**"]), &v(&["upgrade", "**"])));
        // a glob requested where the grant has a different glob: not provable, refused
        assert!(!args_cover(&v(&["v1.3*"]), &v(&["v1.*"])));
        // trailing ** requested but the grant is fixed length
        assert!(!args_cover(&v(&["certs", "renew"]), &v(&["certs", "**"])));
        assert!(!args_cover(
            &v(&["certs", "renew", "all"]),
            &v(&["certs", "renew"])
        ));
        assert!(!args_cover(
            &v(&["certs", "check-expiration"]),
            &v(&["certs", "renew"])
        ));
    }

    #[test]
    fn paths_must_be_under_a_grant_with_enough_access() {
        let grants = Grants {
            filesystem: vec![
                FilesystemGrant {
                    path: "/etc/kubernetes".into(),
                    access: Access::ReadOnly,
                    optional: false,
                },
                FilesystemGrant {
                    path: "/etc/kubernetes/pki".into(),
                    access: Access::ReadWrite,
                    optional: false,
                },
            ],
            ..Grants::default()
        };
        let req = |path: &str, writable| RequestedCapabilities {
            filesystem: vec![PathRequest {
                path: path.into(),
                writable,
            }],
            ..RequestedCapabilities::default()
        };
        assert!(uncovered(&req("/etc/kubernetes/manifests", false), &grants).is_empty());
        assert!(uncovered(&req("/etc/kubernetes/pki/etcd", true), &grants).is_empty());
        assert_eq!(
            uncovered(&req("/etc/kubernetes/manifests", true), &grants).len(),
            1
        );
        assert_eq!(
            uncovered(&req("/etc/kubernetes-evil", false), &grants).len(),
            1
        );
        assert_eq!(
            uncovered(&req("/etc/kubernetes/../shadow", false), &grants).len(),
            1
        );
        assert_eq!(uncovered(&req("etc/kubernetes", false), &grants).len(), 1);
    }

    #[test]
    fn services_http_and_exec_commands() {
        let grants = Grants {
            exec: vec![ExecGrant {
                command: "/usr/bin/kubeadm".into(),
                args: vec![v(&["version", "-o", "short"])],
                timeout_seconds: None,
                max_output_bytes: None,
                dry_run: false,
                optional: false,
                sandbox: Default::default(),
            }],
            services: vec![ServiceGrant {
                unit: "kubelet.service".into(),
                actions: vec![ServiceAction::Restart],
            }],
            http: vec![HttpGrant {
                host: "dl.k8s.io".into(),
                max_bytes: None,
            }],
            ..Grants::default()
        };
        let ok = RequestedCapabilities {
            exec: vec![CommandRequest {
                command: "/usr/bin/kubeadm".into(),
                args: v(&["version", "-o", "short"]),
            }],
            services: vec![UnitRequest {
                unit: "kubelet.service".into(),
                actions: v(&["restart", "status"]),
            }],
            http: v(&["DL.k8s.io"]),
            ..RequestedCapabilities::default()
        };
        assert!(uncovered(&ok, &grants).is_empty());
        let bad = RequestedCapabilities {
            exec: vec![CommandRequest {
                command: "/usr/bin/kubectl".into(),
                args: v(&["version"]),
            }],
            services: vec![UnitRequest {
                unit: "kubelet.service".into(),
                actions: v(&["stop"]),
            }],
            http: v(&["example.com"]),
            ..RequestedCapabilities::default()
        };
        let msgs = uncovered(&bad, &grants);
        assert_eq!(msgs.len(), 3, "{msgs:?}");
        assert!(msgs[0].contains("/usr/bin/kubectl"));
        assert!(msgs[1].contains("stop on kubelet.service"));
        assert!(msgs[2].contains("example.com"));
    }
}
