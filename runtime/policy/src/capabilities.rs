//! The capabilities decision point: requested ⊆ granted, checked in Rust, then policy.
//!
//! [`Grants`] is `bosun_api::grants::Grants` (re-exported). The requests mirror the WIT
//! record `capabilities` that a plugin's `describe()` returns.
//!
//! The subset check is conservative: when it cannot prove that a request is covered by a
//! grant (for example a glob requested where the grant lists literals), it refuses.
//! Refusing a plugin that would have been safe costs an administrator one more grant line;
//! the opposite would run a plugin with more than it was given.

use std::path::{Component, Path};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::input::{CapabilitiesInput, PluginInfo};
use crate::set::{Decision, DecisionPoint, Evaluator, Finding};

/// The grants are bosun-api's own types (plain serde data, no I/O), so the check below
/// reads exactly what the Plugin resource holds.
pub use bosun_api::grants::{
    Access, ExecGrant, FilesystemGrant, Grants, HttpGrant, ServiceAction, ServiceGrant,
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

/// The commands the host itself runs for a plugin besides its exec grants: `systemctl`
/// for its service grants (the systemctl backend starts `/usr/bin/systemctl` under the
/// host root as the agent).
const SYSTEMCTL: &str = "/usr/bin/systemctl";

/// Grant sets that amount to root on the node: a read-write filesystem grant that covers
/// a command the same plugin may run (an exec grant's command, or `systemctl` when it
/// has service grants). The plugin can replace the binary and then have the host run its
/// replacement as the agent, whatever the argument patterns say. One message each.
///
/// The capabilities decision reports these as warnings from policy `bosun` (work goes
/// on); the shipped policy `policies/root-equivalent-grants` denies them.
pub fn root_equivalent(grants: &Grants) -> Vec<String> {
    let mut commands: Vec<&str> = grants.exec.iter().map(|g| g.command.as_str()).collect();
    if !grants.services.is_empty() {
        commands.push(SYSTEMCTL);
    }
    commands.sort_unstable();
    commands.dedup();
    let mut out = Vec::new();
    for command in commands {
        let Some(cmd) = normal_path(command) else {
            continue;
        };
        for g in grants
            .filesystem
            .iter()
            .filter(|g| g.access == Access::ReadWrite)
        {
            if normal_path(&g.path).is_some_and(|dir| cmd.starts_with(&dir)) {
                let why =
                    if command == SYSTEMCTL && !grants.exec.iter().any(|e| e.command == command) {
                        "the host runs it for the plugin's service grants"
                    } else {
                        "the plugin may execute it"
                    };
                out.push(format!(
                    "root-equivalent grants: filesystem {} is read-write and covers {command}, which {why}; \
                     the plugin can replace {command} and have it run as the agent (root). Grant the directory \
                     read-only or more narrowly, or accept the plugin as fully trusted",
                    g.path
                ));
            }
        }
    }
    out
}

impl Evaluator {
    /// The capabilities decision: first every request must be covered by a grant (a
    /// finding from policy `bosun` per uncovered request, and then no policy runs), then
    /// `data.bosun.capabilities.deny` of every policy judges the plugin, its requests and
    /// its grants. Root-equivalent grant sets ([`root_equivalent`]) are added as
    /// warnings from policy `bosun`.
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
            .extend(root_equivalent(grants).into_iter().map(|message| Finding {
                policy: "bosun".into(),
                message,
            }));
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
        }
    }

    fn dir(path: &str, access: Access) -> FilesystemGrant {
        FilesystemGrant {
            path: path.into(),
            access,
            optional: false,
        }
    }

    #[test]
    fn a_writable_grant_over_a_command_the_plugin_runs_is_root_equivalent() {
        // The packages plugin's shape: /usr/bin read-write and kubeadm executable.
        let grants = Grants {
            filesystem: vec![
                dir("/usr/bin", Access::ReadWrite),
                dir("/etc/kubernetes", Access::ReadWrite),
            ],
            exec: vec![exec("/usr/bin/kubeadm"), exec("/usr/sbin/other")],
            ..Grants::default()
        };
        let found = root_equivalent(&grants);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("filesystem /usr/bin is read-write and covers /usr/bin/kubeadm"),
            "{}",
            found[0]
        );
        // Service grants make the host run systemctl.
        let services = Grants {
            filesystem: vec![dir("/usr", Access::ReadWrite)],
            services: vec![ServiceGrant {
                unit: "kubelet.service".into(),
                actions: vec![ServiceAction::Restart],
            }],
            ..Grants::default()
        };
        let found = root_equivalent(&services);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("/usr/bin/systemctl, which the host runs"),
            "{}",
            found[0]
        );
        // Read-only, a sibling directory, or a prefix that is not a path component: none.
        for fs in [
            dir("/usr/bin", Access::ReadOnly),
            dir("/usr/bin2", Access::ReadWrite),
            dir("/usr/b", Access::ReadWrite),
        ] {
            let g = Grants {
                filesystem: vec![fs.clone()],
                exec: vec![exec("/usr/bin/kubeadm")],
                ..Grants::default()
            };
            assert!(root_equivalent(&g).is_empty(), "{fs:?}");
        }
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
