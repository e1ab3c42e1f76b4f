//! The `kubeadm-upgrade` plugin: `kubeadm upgrade plan`, `apply` (the first control-plane
//! node) and `node` (every other node) for a target Kubernetes version.
//!
//! The node's current version is what its control plane runs (the image tag of
//! `/etc/kubernetes/manifests/kube-apiserver.yaml`) on a control-plane node, and the
//! kubelet's version (from the node facts) on a worker. Preflight refuses what kubeadm
//! does not support: a downgrade or a skipped minor version. A kubeadm binary that is not
//! at the target version is only a warning in preflight, because the upgrade's `packages`
//! step before this one installs it (and in a dry run installs nothing); `apply` and `node`
//! refuse to run with it, and a dry run says what it would run once kubeadm is there.
//!
//! In a dry run the host runs only `kubeadm upgrade plan` (its grant is marked `dryRun`):
//! `apply` runs the plan when kubeadm is already at the target, and otherwise reports the
//! command it would run; `node` reports the command it would run.
//!
//! On a node without static Pods (a worker), `node` hashes what kubeadm writes there (the
//! kubelet's configuration, instance configuration and flags in `/var/lib/kubelet`, through
//! a granted `sha256sum` that can read those files only) before and after kubeadm, and
//! reports no change when kubeadm left them as they were:
//! before, a second run said "node upgraded" though nothing changed (the conformance kit
//! found it). kubeadm itself keeps a backup of the file in `/etc/kubernetes/tmp` on every
//! run; the message says so.
//!
//! `apply` and `node` are idempotent: a control-plane node whose kube-apiserver,
//! kube-controller-manager and kube-scheduler manifests are all at the target reports no
//! change without running kubeadm, and kubeadm converges when re-run. All three are read
//! because kubeadm upgrades them one after the other: a run stopped part-way (the agent killed
//! mid-step, as the real-node test does) can leave the API server at the target and the
//! others behind, and the next attempt must then run kubeadm again, not report "done".
//!
//! The manifests cannot show the rest of kubeadm's work: after the static Pods, `kubeadm
//! upgrade apply` writes the kubelet configuration, uploads the cluster configuration and
//! upgrades the kube-proxy and CoreDNS addons (`kubeadm upgrade node` likewise writes the
//! kubelet configuration after the static Pods). A run killed between the two leaves every
//! manifest at the target and those phases undone. So when the run context says `resumed`
//! (the previous attempt of this step on this node was interrupted: the agent re-runs an
//! interrupted idempotent step with it set), `apply` and `node` run kubeadm again even with
//! every manifest at the target, saying so in the log; kubeadm at the version it already
//! runs re-applies its later phases and the addons. A run that is not resumed (the first
//! attempt, or a retry after a recorded failure) keeps the shortcut: all manifests at the
//! target means nothing to do.

use bosun_plugin_sdk::exec::Command;
use bosun_plugin_sdk::prelude::*;
use bosun_plugin_sdk::{facts, fs};

/// The kubeadm binary on the node.
pub const KUBEADM: &str = "/usr/bin/kubeadm";
/// The API server's static pod manifest: its image tag is the control plane's version.
pub const APISERVER_MANIFEST: &str = "/etc/kubernetes/manifests/kube-apiserver.yaml";
/// The other static Pods `kubeadm upgrade apply/node` moves to the target, after the API server.
pub const OTHER_MANIFESTS: [&str; 2] = [
    "/etc/kubernetes/manifests/kube-controller-manager.yaml",
    "/etc/kubernetes/manifests/kube-scheduler.yaml",
];

/// What `kubeadm upgrade node` writes on a node without static Pods (its kubelet-config
/// phase): the kubelet's configuration on every run, and, where the node has no instance
/// configuration yet (kubeadm's `NodeLocalCRISocket`, beta and on by default in v1.34),
/// that file and the kubelet's flags.
pub const KUBELET_FILES: [&str; 3] = [
    "/var/lib/kubelet/config.yaml",
    "/var/lib/kubelet/instance-config.yaml",
    "/var/lib/kubelet/kubeadm-flags.env",
];
/// Hashes [`KUBELET_FILES`] before and after `kubeadm upgrade node`, so the step says
/// whether it changed the node. The plugin reads nothing else of `/var/lib/kubelet` (the
/// kubelet's private key is there): its grant's sandbox is those three files.
pub const SHA256SUM: &str = "/usr/bin/sha256sum";

/// The actions with their params.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "action", content = "params", rename_all = "kebab-case")]
pub enum Action {
    /// `kubeadm upgrade plan VERSION`: what an upgrade would do. Reads only.
    Plan(UpgradeParams),
    /// `kubeadm upgrade apply VERSION` on the first control-plane node.
    Apply(UpgradeParams),
    /// `kubeadm upgrade node` on the other control-plane nodes and the workers.
    Node(UpgradeParams),
}

/// Params of every action.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpgradeParams {
    /// The target version, `vMAJOR.MINOR.PATCH` (for example `v1.34.2`).
    pub kubernetes_version: String,
}

/// A Kubernetes version `vMAJOR.MINOR.PATCH`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl Version {
    /// Parses `v1.34.2` (a leading `v` is optional; pre-release and build suffixes such as
    /// `-rc.1` are refused: kubeadm upgrades between releases).
    ///
    /// # Errors
    /// A message naming the text and the expected form.
    pub fn parse(text: &str) -> Result<Version, String> {
        let t = text.trim();
        let v = semver::Version::parse(t.strip_prefix('v').unwrap_or(t))
            .map_err(|e| format!("`{text}` is not a version like v1.34.2 ({e})"))?;
        if !v.pre.is_empty() || !v.build.is_empty() {
            return Err(format!(
                "`{text}` is a pre-release or build version; expected a release like v1.34.2"
            ));
        }
        Ok(Version {
            major: v.major,
            minor: v.minor,
            patch: v.patch,
        })
    }
}

/// Whether kubeadm can upgrade from `current` to `target`: same major, no downgrade, at
/// most one minor version up.
///
/// # Errors
/// Why not, in words for a preflight message.
pub fn step_allowed(current: Version, target: Version) -> Result<(), String> {
    if target < current {
        return Err(format!(
            "{target} is older than the node's {current}: kubeadm does not downgrade"
        ));
    }
    if target.major != current.major || target.minor > current.minor + 1 {
        return Err(format!(
            "{current} → {target} skips a minor version: kubeadm upgrades one minor version at a time; upgrade to v{}.{}.x first",
            current.major,
            current.minor + 1
        ));
    }
    Ok(())
}

/// The version in the image tag of a static pod manifest (`image: registry.k8s.io/kube-apiserver:v1.34.4`).
#[must_use]
pub fn manifest_version(manifest: &str) -> Option<Version> {
    manifest.lines().find_map(|l| {
        let image = l.trim().strip_prefix("image:")?.trim().trim_matches('"');
        let tag = image.rsplit_once(':')?.1;
        Version::parse(tag).ok()
    })
}

/// The plugin.
pub struct KubeadmUpgrade;

impl Plugin for KubeadmUpgrade {
    type Action = Action;

    fn metadata() -> Metadata {
        bosun_plugin_sdk::metadata!()
            .name("kubeadm-upgrade")
            .action(ActionInfo::new("plan", "Show what `kubeadm upgrade plan` would do for the target version").params::<UpgradeParams>().idempotent())
            .action(ActionInfo::new("apply", "Upgrade the control plane with `kubeadm upgrade apply` (first control-plane node)").params::<UpgradeParams>().idempotent())
            .action(ActionInfo::new("node", "Upgrade this node with `kubeadm upgrade node` (other control-plane nodes, workers)").params::<UpgradeParams>().idempotent())
            .reads("/etc/kubernetes/manifests")
            .runs(KUBEADM, ["upgrade", "plan", "v*"])
            .runs(KUBEADM, ["upgrade", "apply", "--yes", "v*"])
            .runs(KUBEADM, ["upgrade", "node"])
            .runs(SHA256SUM, KUBELET_FILES)
    }

    fn preflight(action: &Action) -> Result<Vec<Check>, PluginError> {
        let (name, p) = split(action);
        let target = match Version::parse(&p.kubernetes_version) {
            Ok(v) => v,
            Err(m) => return Ok(vec![Check::fail("target-version", m)]),
        };
        let facts = facts::node()?;
        let mut checks = Vec::new();
        if name == "apply" {
            checks.push(Check::require(
                "control-plane",
                facts.is_control_plane() && std::fs::metadata(APISERVER_MANIFEST).is_ok(),
                if facts.is_control_plane() {
                    format!("{} is a control-plane node; {APISERVER_MANIFEST} must exist", facts.node_name)
                } else {
                    format!("{} is not a control-plane node: `apply` runs on the first control-plane node, workers run `node`", facts.node_name)
                },
            ));
        }
        match current_version(&facts) {
            Ok((current, source)) => checks.push(match step_allowed(current, target) {
                Ok(()) => Check::pass("version-step", format!("{current} ({source}) → {target}")),
                Err(m) => Check::fail("version-step", m),
            }),
            Err(m) => checks.push(Check::fail("version-step", m)),
        }
        // Checked for real in `run`: the packages step that installs kubeadm runs between
        // this preflight's task start and the run, and in a dry run installs nothing.
        checks.push(match kubeadm_at(&facts, target) {
            Ok(v) => Check::pass("kubeadm-version", format!("{KUBEADM} is {v}")),
            Err(m) => Check::warn(
                "kubeadm-version",
                format!("{m}; the upgrade's `upgrade-kubeadm` packages step installs it before this step runs"),
            ),
        });
        Ok(checks)
    }

    fn run(action: Action, ctx: &RunContext) -> Result<Outcome, PluginError> {
        let (name, p) = split(&action);
        let target =
            Version::parse(&p.kubernetes_version).map_err(|m| PluginError::new("bad-params", m))?;
        // `apply` and `node` run kubeadm at the target version only.
        let kubeadm = if name == "plan" {
            Ok(target)
        } else {
            kubeadm_at(&facts::node()?, target)
        };
        if let (Err(m), false) = (&kubeadm, ctx.dry_run) {
            return Err(PluginError::new(
                "kubeadm-version",
                format!(
                    "{m}: install kubeadm {target} first (the upgrade's `upgrade-kubeadm` packages step does), then retry"
                ),
            ));
        }
        match name {
            "plan" => {
                let out = Command::new(KUBEADM)
                    .args(["upgrade", "plan"])
                    .arg(target.to_string())
                    .run()?;
                let text = out.stdout_text();
                info!("{text}");
                Ok(Outcome::unchanged(format!(
                    "kubeadm upgrade plan {target}: see the log for kubeadm's plan"
                ))
                .output("plan", tail(&text, 8192)))
            }
            "apply" => {
                let rerun = match at_target(
                    target,
                    control_plane_version()?,
                    ctx,
                    "kubeadm upgrade apply",
                )? {
                    AtTarget::Done => {
                        return Ok(Outcome::unchanged(format!(
                            "the control plane already runs {target}; nothing to apply"
                        )));
                    }
                    AtTarget::Resumed => true,
                    AtTarget::No => false,
                };
                if ctx.dry_run {
                    return dry_apply(target, kubeadm);
                }
                let out = Command::new(KUBEADM)
                    .args(["upgrade", "apply", "--yes"])
                    .arg(target.to_string())
                    .run()?;
                info!("{}", tail(&out.stdout_text(), 4096));
                match control_plane_version()? {
                    Some(v) if v == target => Ok(Outcome::changed(if rerun {
                        format!(
                            "control plane at {target}: `kubeadm upgrade apply` ran again after an interrupted attempt"
                        )
                    } else {
                        format!("control plane upgraded to {target}")
                    })
                    .output("version", target)),
                    other => Err(PluginError::new(
                        "upgrade-not-applied",
                        format!(
                            "`kubeadm upgrade apply {target}` exited 0 but {APISERVER_MANIFEST} shows {}; check kubeadm's log on the node",
                            other.map_or_else(|| "no version".to_owned(), |v| v.to_string())
                        ),
                    )),
                }
            }
            _ => {
                let current = control_plane_version()?;
                let rerun = match at_target(target, current, ctx, "kubeadm upgrade node")? {
                    AtTarget::Done => {
                        return Ok(Outcome::unchanged(format!(
                            "this control-plane node already runs {target}"
                        )));
                    }
                    AtTarget::Resumed => true,
                    AtTarget::No => false,
                };
                if ctx.dry_run {
                    return Ok(Outcome::unchanged(match kubeadm {
                        Ok(_) => format!("would run `kubeadm upgrade node` (kubeadm {target})"),
                        Err(m) => format!(
                            "would run `kubeadm upgrade node` with kubeadm {target} once the upgrade's packages step installed it ({m})"
                        ),
                    }));
                }
                let static_pods = current.is_some();
                let before = kubelet_files_digest();
                let out = Command::new(KUBEADM).args(["upgrade", "node"]).run()?;
                info!("{}", tail(&out.stdout_text(), 4096));
                // On a node without static Pods (a worker) kubeadm's one change is the
                // kubelet's configuration: the step says whether it changed.
                if !static_pods
                    && !rerun
                    && let (Some(before), Some(after)) = (before, kubelet_files_digest())
                    && !before.is_empty()
                    && before == after
                {
                    return Ok(Outcome::unchanged(format!(
                        "node at {target}: `kubeadm upgrade node` left the kubelet's configuration and flags as they were (kubeadm keeps a backup of the configuration in /etc/kubernetes/tmp on every run)"
                    ))
                    .output("version", target));
                }
                Ok(Outcome::changed(if rerun {
                    format!(
                        "node at {target}: `kubeadm upgrade node` ran again after an interrupted attempt"
                    )
                } else {
                    format!("node upgraded with kubeadm {target}")
                })
                .output("version", target))
            }
        }
    }
}

/// The sha256 of each of [`KUBELET_FILES`] that exists, by path; `None` when they cannot be
/// hashed (then the step reports a change, as it always did: it cannot tell).
fn kubelet_files_digest() -> Option<std::collections::BTreeMap<String, String>> {
    // sha256sum exits 1 when a file is missing and still hashes the others.
    match Command::new(SHA256SUM).args(KUBELET_FILES).output() {
        Ok(out) if out.exit_code <= 1 => Some(parse_sha256sum(&out.stdout_text())),
        Ok(out) => {
            warn!(
                "{SHA256SUM} exited with {}: {}; the step reports a change",
                out.exit_code,
                tail(&out.stderr_text(), 300)
            );
            None
        }
        Err(e) => {
            warn!("cannot hash the kubelet's files ({e}); the step reports a change");
            None
        }
    }
}

/// `sha256sum`'s lines (`HASH  PATH`) as path → hash; other lines are left out.
#[must_use]
pub fn parse_sha256sum(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| {
            let (hash, path) = l.split_once("  ")?;
            (hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| (path.to_owned(), hash.to_owned()))
        })
        .collect()
}

/// `Ok(version)` when the node's kubeadm is at `target`, otherwise what it is instead.
fn kubeadm_at(facts: &facts::NodeFacts, target: Version) -> Result<Version, String> {
    match facts.kubeadm_version.as_deref().map(Version::parse) {
        Some(Ok(v)) if v == target => Ok(v),
        Some(Ok(v)) => Err(format!("{KUBEADM} is {v}, not {target}")),
        Some(Err(m)) => Err(format!("{KUBEADM} reports {m}")),
        None => Err(format!("{KUBEADM} is missing or does not run")),
    }
}

/// The dry run of `apply`: kubeadm's own plan when kubeadm is at the target already
/// (`kubeadm upgrade plan` only reads, and is the one kubeadm command a dry run may run),
/// otherwise the command that would run once it is.
fn dry_apply(target: Version, kubeadm: Result<Version, String>) -> Result<Outcome, PluginError> {
    if let Err(m) = kubeadm {
        return Ok(Outcome::unchanged(format!(
            "would run `kubeadm upgrade apply --yes {target}` with kubeadm {target} once the upgrade's packages step installed it ({m})"
        )));
    }
    let out = Command::new(KUBEADM)
        .args(["upgrade", "plan"])
        .arg(target.to_string())
        .run()?;
    let text = out.stdout_text();
    info!("{}", tail(&text, 4096));
    Ok(Outcome::unchanged(format!(
        "would run `kubeadm upgrade apply --yes {target}`; `kubeadm upgrade plan {target}` passed (its plan is in the log)"
    ))
    .output("plan", tail(&text, 8192)))
}

fn split(action: &Action) -> (&'static str, &UpgradeParams) {
    match action {
        Action::Plan(p) => ("plan", p),
        Action::Apply(p) => ("apply", p),
        Action::Node(p) => ("node", p),
    }
}

/// The control plane's version on this node, `None` when it has no API server manifest.
fn control_plane_version() -> Result<Option<Version>, PluginError> {
    match fs::read_optional(APISERVER_MANIFEST) {
        Ok(Some(text)) => manifest_version(&text).map(Some).ok_or_else(|| {
            PluginError::new(
                "bad-manifest",
                format!("{APISERVER_MANIFEST} has no image with a version tag"),
            )
        }),
        Ok(None) => Ok(None),
        // A worker usually has no grant there worth failing for.
        Err(e) if e.code() == "file-not-found" => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Where `apply` and `node` stand before running kubeadm.
enum AtTarget {
    /// Every static Pod of this node already runs the target and the run is not resumed:
    /// nothing to do.
    Done,
    /// Every static Pod already runs the target, but the previous attempt was interrupted:
    /// kubeadm's later phases may be undone, so kubeadm runs again.
    Resumed,
    /// Not every static Pod runs the target (or this is a worker): kubeadm runs.
    No,
}

/// Where this node stands for `apply` or `node` (which runs `command`), its control plane at
/// `current` ([`control_plane_version`], read once by the caller). When every static
/// Pod runs `target` and the run is resumed, says in the log why kubeadm runs again:
/// kubeadm may have stopped after the static Pods and before its later phases (kubelet
/// configuration, uploaded configuration, the kube-proxy and CoreDNS addons).
fn at_target(
    target: Version,
    current: Option<Version>,
    ctx: &RunContext,
    command: &str,
) -> Result<AtTarget, PluginError> {
    if !fully_at(target, current)? {
        return Ok(AtTarget::No);
    }
    if ctx.resumed {
        info!(
            "the static Pods already run {target}, but the previous attempt of this step was interrupted: kubeadm may have stopped after upgrading them and before its later phases (kubelet configuration, uploaded configuration, the kube-proxy and CoreDNS addons); running `{command}` again, which converges"
        );
        return Ok(AtTarget::Resumed);
    }
    Ok(AtTarget::Done)
}

/// True when this node's control plane runs `target` in full: kube-apiserver (at `current`)
/// and the other static Pods. When only the API server does (a run stopped part-way), says so and returns
/// false, so kubeadm runs again.
fn fully_at(target: Version, current: Option<Version>) -> Result<bool, PluginError> {
    if current != Some(target) {
        return Ok(false);
    }
    let behind = components_behind(target)?;
    if !behind.is_empty() {
        warn!(
            "kube-apiserver is at {target} but {} not: an earlier run stopped part-way; running kubeadm again",
            behind.join(", ")
        );
    }
    Ok(behind.is_empty())
}

/// The static Pods other than the API server whose manifest exists and is not at `target`,
/// as `name (version)`.
fn components_behind(target: Version) -> Result<Vec<String>, PluginError> {
    let mut behind = Vec::new();
    for path in OTHER_MANIFESTS {
        let text = match fs::read_optional(path) {
            Ok(Some(text)) => text,
            Ok(None) => continue,
            Err(e) if e.code() == "file-not-found" => continue,
            Err(e) => return Err(e.into()),
        };
        let name = path
            .rsplit('/')
            .next()
            .unwrap_or(path)
            .trim_end_matches(".yaml");
        match manifest_version(&text) {
            Some(v) if v == target => {}
            Some(v) => behind.push(format!("{name} ({v})")),
            None => behind.push(format!("{name} (no version tag)")),
        }
    }
    Ok(behind)
}

/// The node's current version and where it came from.
fn current_version(facts: &facts::NodeFacts) -> Result<(Version, &'static str), String> {
    if let Ok(Some(v)) = control_plane_version() {
        return Ok((v, "control plane"));
    }
    match facts.kubelet_version.as_deref() {
        Some(k) => Version::parse(k).map(|v| (v, "kubelet")),
        None => Err("cannot tell the node's version: no kube-apiserver manifest and no kubelet version in the node facts".into()),
    }
}

fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_owned()
}

bosun_plugin_sdk::export_plugin!(KubeadmUpgrade);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256sum_lines_are_read_by_path_and_errors_left_out() {
        let a = "a".repeat(64);
        let b = "0123456789abcdef".repeat(4);
        let text = format!(
            "{a}  /var/lib/kubelet/config.yaml\n{b}  /var/lib/kubelet/kubeadm-flags.env\nsha256sum: /var/lib/kubelet/instance-config.yaml: No such file or directory\nshort  /x\n"
        );
        let m = parse_sha256sum(&text);
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!(m["/var/lib/kubelet/config.yaml"], a);
        assert_eq!(m["/var/lib/kubelet/kubeadm-flags.env"], b);
    }

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap()
    }

    #[test]
    fn one_minor_step_and_no_downgrade() {
        assert!(step_allowed(v("v1.33.5"), v("v1.34.2")).is_ok());
        assert!(step_allowed(v("v1.34.1"), v("v1.34.2")).is_ok());
        assert!(step_allowed(v("v1.34.2"), v("v1.34.2")).is_ok());
        assert!(
            step_allowed(v("v1.33.5"), v("v1.35.0"))
                .unwrap_err()
                .contains("skips a minor version")
        );
        assert!(
            step_allowed(v("v1.34.2"), v("v1.34.1"))
                .unwrap_err()
                .contains("does not downgrade")
        );
        assert!(step_allowed(v("v1.34.2"), v("v2.0.0")).is_err());
    }

    #[test]
    fn versions_parse_strictly() {
        assert_eq!(v("1.34.2"), v("v1.34.2"));
        assert!(Version::parse("v1.34").is_err());
        assert!(
            Version::parse("v1.35.0-rc.1")
                .unwrap_err()
                .contains("pre-release")
        );
    }

    #[test]
    fn manifest_image_tag_is_the_version() {
        let m = "spec:\n  containers:\n  - command:\n    - kube-apiserver\n    image: registry.k8s.io/kube-apiserver:v1.34.4\n";
        assert_eq!(manifest_version(m), Some(v("v1.34.4")));
        assert_eq!(
            manifest_version("image: localhost:5000/kube-apiserver:v1.33.1"),
            Some(v("v1.33.1"))
        );
        assert_eq!(manifest_version("no image here"), None);
    }

    #[test]
    fn metadata_has_the_planner_actions() {
        let m = KubeadmUpgrade::metadata();
        assert_eq!(m.name, "kubeadm-upgrade");
        let names: Vec<_> = m.actions.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["plan", "apply", "node"]);
        // kubeadm, and sha256sum over the kubelet's three files only.
        assert!(m.capabilities.exec.iter().all(|c| c.command == KUBEADM
            || (c.command == SHA256SUM && c.args == KUBELET_FILES.map(String::from).to_vec())));
        assert_eq!(
            m.capabilities
                .exec
                .iter()
                .filter(|c| c.command == SHA256SUM)
                .count(),
            1
        );
    }
}
