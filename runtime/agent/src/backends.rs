//! Which Plugin runs a step on this node: the one the step names, or a backend that stands
//! in for it on this node's OS family (`spec.backend` of a Plugin).
//!
//! The agent chooses, not the planner, when the step runs:
//! - the family comes from this node's own os-release, read from its host root as the step
//!   starts, not from a report that may be older than the node's last reinstall;
//! - the controller reads no Plugin objects and plans the same steps for every node, so a
//!   backend published or withdrawn mid-rollout applies to the nodes that have not run yet;
//! - the Plugin that ran is written in the step's message and its report, and policies see
//!   it (`input.plugin`) beside the name the step gave (`input.step.plugin`).
//!
//! The rules ([`choose`]), with the node's keys its `ID` and then its `ID_LIKE` entries, in
//! order:
//! 1. No Plugin declares a backend for the step's plugin name: the named plugin runs.
//! 2. Otherwise the first key some backend claims decides: one claimant runs; two or more are
//!    refused ([`BackendError::Ambiguous`]), naming them.
//! 3. No key claimed: the named plugin runs if it exists and declares no backend of its own
//!    (it serves every family no backend claims). If it declares one, or there is no Plugin
//!    of that name (the name only stands for what its backends do), no plugin serves this
//!    node ([`BackendError::NoneServes`]), and the refusal lists what each candidate serves.

use bosun_api::plugin::Plugin;
use kube::ResourceExt;

/// The Plugin chosen for a step on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The Plugin resource to run.
    pub plugin: String,
    /// The family key the backend was chosen by (`None`: the step's own plugin, chosen
    /// because no backend claims this node).
    pub family: Option<String>,
    /// The plugins that declared a backend for the step's name, each with its families, for
    /// messages (`zypper (opensuse-leap, sles, suse)`).
    pub considered: Vec<String>,
}

/// This node's OS, as the keys a backend's `osFamilies` is matched against.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeOs {
    pub id: String,
    pub id_like: Vec<String>,
}

impl NodeOs {
    /// `ID`, then the `ID_LIKE` entries, empty ones and repeats left out.
    fn keys(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = Vec::new();
        for k in std::iter::once(self.id.as_str()).chain(self.id_like.iter().map(String::as_str)) {
            if !k.is_empty() && !keys.contains(&k) {
                keys.push(k);
            }
        }
        keys
    }

    /// `ID=opensuse-leap, ID_LIKE="suse opensuse"` (what the node's os-release says).
    pub fn describe(&self) -> String {
        let id = if self.id.is_empty() {
            "unknown (no os-release ID)"
        } else {
            &self.id
        };
        if self.id_like.is_empty() {
            format!("ID={id}")
        } else {
            format!("ID={id}, ID_LIKE=\"{}\"", self.id_like.join(" "))
        }
    }
}

/// Why no Plugin could be chosen. The messages name the node, its family and the plugins
/// considered, and say what to change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    #[error(
        "node {node} ({os}): Plugins {} each declare spec.backend for `{for_plugin}` steps on OS family {family}, so none is chosen; keep {family} in one Plugin's spec.backend.osFamilies, then retry",
        claimants.join(" and ")
    )]
    Ambiguous {
        node: String,
        os: String,
        for_plugin: String,
        family: String,
        claimants: Vec<String>,
    },
    #[error(
        "node {node} ({os}): no Plugin serves `{for_plugin}` steps on this OS family; considered: {}; publish a Plugin with spec.backend {{for: {for_plugin}, osFamilies: [{}]}} (docs/plugins.md, \"Backends for an OS family\"), then retry",
        considered.join(", "),
        family
    )]
    NoneServes {
        node: String,
        os: String,
        for_plugin: String,
        /// The most specific key: the node's `ID`.
        family: String,
        considered: Vec<String>,
    },
}

/// Chooses the Plugin that runs a step naming `step_plugin` on node `node` with `os`, among
/// `plugins` (every Plugin of the cluster). See the module documentation for the rules.
pub fn choose(
    node: &str,
    os: &NodeOs,
    step_plugin: &str,
    plugins: &[Plugin],
) -> Result<Choice, BackendError> {
    let mut candidates: Vec<&Plugin> = plugins
        .iter()
        .filter(|p| {
            p.spec
                .backend
                .as_ref()
                .is_some_and(|b| b.for_plugin == step_plugin)
        })
        .collect();
    candidates.sort_by_key(|p| p.name_any());
    let considered: Vec<String> = candidates
        .iter()
        .map(|p| {
            let families = p
                .spec
                .backend
                .as_ref()
                .map(|b| b.os_families.join(", "))
                .unwrap_or_default();
            format!("{} ({families})", p.name_any())
        })
        .collect();
    let named = |family: Option<String>| Choice {
        plugin: step_plugin.to_owned(),
        family,
        considered: considered.clone(),
    };
    if candidates.is_empty() {
        return Ok(named(None));
    }
    for key in os.keys() {
        let claimants: Vec<String> = candidates
            .iter()
            .filter(|p| {
                p.spec
                    .backend
                    .as_ref()
                    .is_some_and(|b| b.os_families.iter().any(|f| f == key))
            })
            .map(|p| p.name_any())
            .collect();
        match claimants.as_slice() {
            [] => continue,
            [one] => {
                return Ok(Choice {
                    plugin: one.clone(),
                    family: Some(key.to_owned()),
                    considered,
                });
            }
            _ => {
                return Err(BackendError::Ambiguous {
                    node: node.to_owned(),
                    os: os.describe(),
                    for_plugin: step_plugin.to_owned(),
                    family: key.to_owned(),
                    claimants,
                });
            }
        }
    }
    let named_serves_the_rest = plugins
        .iter()
        .any(|p| p.name_any() == step_plugin && p.spec.backend.is_none());
    if named_serves_the_rest {
        return Ok(named(None));
    }
    Err(BackendError::NoneServes {
        node: node.to_owned(),
        os: os.describe(),
        for_plugin: step_plugin.to_owned(),
        family: if os.id.is_empty() {
            "<the node's os-release ID>".to_owned()
        } else {
            os.id.clone()
        },
        considered,
    })
}

#[cfg(test)]
mod tests {
    use bosun_api::plugin::{Backend, PluginSource, PluginSpec};

    use super::*;

    fn plugin(name: &str, backend: Option<(&str, &[&str])>) -> Plugin {
        Plugin::new(
            name,
            PluginSpec {
                source: PluginSource::default(),
                sha256: String::new(),
                signatures: Vec::new(),
                grants: Default::default(),
                backend: backend.map(|(for_plugin, families)| Backend {
                    for_plugin: for_plugin.to_owned(),
                    os_families: families.iter().map(|f| (*f).to_owned()).collect(),
                }),
            },
        )
    }

    fn os(id: &str, like: &[&str]) -> NodeOs {
        NodeOs {
            id: id.to_owned(),
            id_like: like.iter().map(|l| (*l).to_owned()).collect(),
        }
    }

    const LEAP: (&str, &[&str]) = ("opensuse-leap", &["suse", "opensuse"]);
    const DEBIAN: (&str, &[&str]) = ("debian", &[]);
    const UBUNTU: (&str, &[&str]) = ("ubuntu", &["debian"]);
    const ROCKY: (&str, &[&str]) = ("rocky", &["rhel", "centos", "fedora"]);

    /// Each case: the plugins of the cluster, the node's os-release, and the Plugin chosen
    /// for a `packages` step (with the family it was chosen by), or the refusal's message
    /// parts.
    #[test]
    fn the_backend_for_a_node_is_chosen_by_its_os_release() {
        let packages = || plugin("packages", None);
        let first_party = || {
            plugin(
                "packages",
                Some(("packages", &["debian", "ubuntu", "rhel", "fedora"])),
            )
        };
        let zypper = || {
            plugin(
                "zypper",
                Some(("packages", &["opensuse-leap", "sles", "suse"])),
            )
        };
        let other_suse = || plugin("suse-pm", Some(("packages", &["suse"])));
        let leap_only = || plugin("leap-pm", Some(("packages", &["opensuse-leap"])));
        let for_certs = || plugin("certs-suse", Some(("certs", &["suse"])));
        type Want = Result<(&'static str, Option<&'static str>), &'static [&'static str]>;
        type Case = (
            &'static str,
            Vec<Plugin>,
            (&'static str, &'static [&'static str]),
            Want,
        );
        let cases: Vec<Case> = vec![
            (
                "no backends: the named plugin",
                vec![packages()],
                LEAP,
                Ok(("packages", None)),
            ),
            (
                "a backend for another step's plugin is not one",
                vec![packages(), for_certs()],
                LEAP,
                Ok(("packages", None)),
            ),
            (
                "the SUSE backend on a Leap node, by its ID",
                vec![packages(), zypper()],
                LEAP,
                Ok(("zypper", Some("opensuse-leap"))),
            ),
            (
                "the named plugin on the Debian node beside it",
                vec![packages(), zypper()],
                DEBIAN,
                Ok(("packages", None)),
            ),
            (
                "an ID claim wins over an ID_LIKE claim",
                vec![packages(), other_suse(), leap_only()],
                LEAP,
                Ok(("leap-pm", Some("opensuse-leap"))),
            ),
            (
                "an ID_LIKE claim when no ID claim",
                vec![packages(), other_suse()],
                LEAP,
                Ok(("suse-pm", Some("suse"))),
            ),
            (
                "the first-party plugin by its own declaration",
                vec![first_party(), zypper()],
                UBUNTU,
                Ok(("packages", Some("ubuntu"))),
            ),
            (
                "ID_LIKE in order: rhel before fedora",
                vec![first_party()],
                ROCKY,
                Ok(("packages", Some("rhel"))),
            ),
            (
                "two claim one family",
                vec![
                    packages(),
                    zypper(),
                    plugin("sles-pm", Some(("packages", &["sles"]))),
                ],
                ("sles", &["suse"]),
                Err(&[
                    "node n1 (ID=sles, ID_LIKE=\"suse\")",
                    "Plugins sles-pm and zypper each declare spec.backend for `packages` steps on OS family sles",
                ]),
            ),
            (
                "an ID claim wins over two ID_LIKE claims",
                vec![packages(), zypper(), other_suse()],
                ("sles", &["suse"]),
                Ok(("zypper", Some("sles"))),
            ),
            (
                "two claim the ID_LIKE family that decides",
                vec![packages(), zypper(), other_suse()],
                ("opensuse-tumbleweed", &["opensuse", "suse"]),
                Err(&[
                    "suse-pm and zypper",
                    "OS family suse",
                    "keep suse in one Plugin's spec.backend.osFamilies",
                ]),
            ),
            (
                "none serves: the named plugin declared its own families",
                vec![first_party(), zypper()],
                ("arch", &[]),
                Err(&[
                    "node n1 (ID=arch): no Plugin serves `packages` steps on this OS family",
                    "considered: packages (debian, ubuntu, rhel, fedora), zypper (opensuse-leap, sles, suse)",
                    "osFamilies: [arch]",
                ]),
            ),
            (
                "none serves: the named plugin does not exist",
                vec![zypper()],
                DEBIAN,
                Err(&[
                    "node n1 (ID=debian): no Plugin serves `packages` steps",
                    "considered: zypper (opensuse-leap, sles, suse)",
                ]),
            ),
            (
                "none serves a node without an os-release ID",
                vec![first_party()],
                ("", &[]),
                Err(&[
                    "ID=unknown (no os-release ID)",
                    "osFamilies: [<the node's os-release ID>]",
                ]),
            ),
        ];
        for (what, plugins, (id, like), want) in cases {
            let got = choose("n1", &os(id, like), "packages", &plugins);
            match (want, got) {
                (Ok((plugin, family)), Ok(c)) => {
                    assert_eq!(
                        (c.plugin.as_str(), c.family.as_deref()),
                        (plugin, family),
                        "{what}"
                    );
                }
                (Err(parts), Err(e)) => {
                    let message = e.to_string();
                    for part in parts {
                        assert!(message.contains(part), "{what}: {message:?} lacks {part:?}");
                    }
                }
                (want, got) => panic!("{what}: wanted {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn the_considered_list_names_every_candidate_with_its_families() {
        let plugins = [
            plugin("packages", None),
            plugin("zypper", Some(("packages", &["suse"]))),
        ];
        let c = choose("n1", &os("debian", &[]), "packages", &plugins).unwrap();
        assert_eq!(c.considered, vec!["zypper (suse)".to_string()]);
    }
}
