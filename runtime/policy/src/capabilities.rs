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

impl Evaluator {
    /// The capabilities decision: first every request must be covered by a grant (a
    /// finding from policy `bosun` per uncovered request, and then no policy runs), then
    /// `data.bosun.capabilities.deny` of every policy judges the plugin, its requests and
    /// its grants.
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
        self.evaluate_input(DecisionPoint::Capabilities, &input)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| (*s).to_owned()).collect()
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
