//! The `packages` plugin: puts packages at an exact version and holds them there.
//!
//! Backends (module [`backend`] and [`binary`]):
//! - **apt** (Debian, Ubuntu): `apt-get install NAME=VERSION`, held with `apt-mark hold`,
//!   state read with `dpkg-query`, versions with `apt-cache madison`;
//! - **dnf** (RHEL family 8 and later, Fedora; yum 3 is refused, [`NO_YUM`]): `dnf install NAME-VERSION --disableexcludes=all`
//!   (`downgrade` for older versions), held with the versionlock plugin when installed,
//!   otherwise by the repository's `exclude=` line, as pkgs.k8s.io sets it up;
//! - **binary**: download from a granted URL, check SHA-256, atomic replace, previous kept
//!   for `rollback`.
//!
//! The family comes from the node's os-release (facts); a node of another family fails
//! preflight saying so, unless the step asks for the binary backend. One Plugin serves a
//! mixed fleet: its grants name every backend's commands as `optional` (a Debian node has
//! no dnf), and the preflight check `backend-commands` requires exactly the commands of
//! the backend chosen for this node.
//!
//! `install` is idempotent: packages already at the wanted version and hold state are left
//! alone, and the step reports no change. The planner's upgrade steps call it as
//! `install {"packages": ["kubeadm"], "kubernetesVersion": "v1.34.2"}`: the version is the
//! newest one the repositories offer whose upstream part is `1.34.2`.
//!
//! `install` (about 150 lines) is kept whole on purpose: one install in the order it happens
//! on the node (the wanted versions resolved, the holds that stand in the way released, the
//! install, the holds set, each package read back from the package manager), the same for
//! every backend, so that a reader follows what the package manager sees in one place.

pub mod backend;
pub mod binary;

use bosun_plugin_sdk::prelude::*;
use bosun_plugin_sdk::{facts, log};

use backend::{
    APT_CACHE, APT_GET, APT_INSTALL_OPTS, APT_MARK, APT_PKG_PATTERN, Apt, Backend, DNF, DNF_LINK,
    DPKG_FORMAT, DPKG_QUERY, Dnf, Installed, MAX_PACKAGES, NAME_PATTERN, RPM, RPM_PKG_PATTERN,
};
use binary::BinarySpec;

/// Which backend a step uses.
#[derive(Clone, Copy, Debug, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackendName {
    Apt,
    Dnf,
    /// Refused, saying why: on RHEL 8 and later yum is dnf, and yum 3 is not driven
    /// ([`NO_YUM`]). Kept so that a step written for yum gets that reason, not a schema error.
    Yum,
    Binary,
}

/// Why this plugin does not drive yum 3, for the refusals that meet it.
pub const NO_YUM: &str = "yum 3 (RHEL and CentOS 7, Oracle Linux 7, Amazon Linux 2) is not driven by this plugin: \
     each of those releases is past the end of its maintenance support (June 2024; Amazon Linux 2 June 2026), boots \
     with cgroup v1, on which the kubelet refuses to start from Kubernetes v1.35 (failCgroupV1), and has a kernel \
     without Landlock for the boundary of granted commands. Set `backend: binary` to install the Kubernetes \
     binaries from dl.k8s.io instead (docs/plugins-first-party.md, \"No yum 3\")";

/// The actions with their params.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "action", content = "params", rename_all = "kebab-case")]
pub enum Action {
    /// Install packages at an exact version (and hold them).
    Install(InstallParams),
    /// Hold packages at their installed version.
    Hold(NamesParams),
    /// Release held packages.
    Unhold(NamesParams),
    /// Put back the binaries a binary install replaced.
    Rollback(RollbackParams),
}

/// Params of `install`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstallParams {
    /// Package names (at most 4), for example `["kubeadm"]`.
    #[serde(default)]
    pub packages: Vec<String>,
    /// Kubernetes version (`v1.34.2`): each package goes to the newest available version
    /// whose upstream part is `1.34.2`. For the binary backend, the release to download.
    #[serde(default)]
    pub kubernetes_version: Option<String>,
    /// The exact package version for every listed package (`1.34.2-1.1`); overrides
    /// `kubernetesVersion`.
    #[serde(default)]
    pub version: Option<String>,
    /// Hold the packages at that version afterwards. Default true.
    #[serde(default = "yes")]
    pub hold: bool,
    /// Refresh the repository metadata first (`apt-get update`, `dnf makecache`). Default
    /// true; skipped in a dry run.
    #[serde(default = "yes")]
    pub update: bool,
    /// Force a backend instead of choosing by os-release.
    #[serde(default)]
    pub backend: Option<BackendName>,
    /// Binaries to install (binary backend). Absent with the binary backend: `packages` at
    /// `kubernetesVersion` from `baseUrl`.
    #[serde(default)]
    pub binaries: Vec<BinarySpec>,
    /// Base URL for derived binaries: `{baseUrl}/{version}/bin/linux/{arch}/{name}`.
    /// Default `https://dl.k8s.io/release`.
    #[serde(default)]
    pub base_url: Option<String>,
}

fn yes() -> bool {
    true
}

/// Params of `hold` and `unhold`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamesParams {
    /// Package names.
    pub packages: Vec<String>,
    /// Force a backend instead of choosing by os-release.
    #[serde(default)]
    pub backend: Option<BackendName>,
}

/// Params of `rollback`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RollbackParams {
    /// Target paths of binaries installed by the binary backend (`/usr/bin/kubeadm`).
    pub paths: Vec<String>,
}

/// The plugin.
pub struct Packages;

impl Plugin for Packages {
    type Action = Action;

    fn metadata() -> Metadata {
        let mut m = bosun_plugin_sdk::metadata!()
            .name("packages")
            .action(ActionInfo::new("install", "Install packages at an exact version with apt, dnf or as downloaded binaries, and hold them").params::<InstallParams>().idempotent())
            .action(ActionInfo::new("hold", "Hold packages at their installed version").params::<NamesParams>().idempotent())
            .action(ActionInfo::new("unhold", "Release held packages").params::<NamesParams>().idempotent())
            .action(ActionInfo::new("rollback", "Put back the binaries the binary backend replaced").params::<RollbackParams>());
        // apt
        m = m
            .runs(APT_GET, ["-q", "update"])
            .runs(APT_CACHE, ["madison", NAME_PATTERN])
            .runs(APT_MARK, ["hold", NAME_PATTERN])
            .runs(APT_MARK, ["unhold", NAME_PATTERN])
            .runs(DPKG_QUERY, ["-W", DPKG_FORMAT, NAME_PATTERN]);
        for n in 1..=MAX_PACKAGES {
            let mut args: Vec<&str> = APT_INSTALL_OPTS.to_vec();
            args.push("install");
            args.extend(std::iter::repeat_n(APT_PKG_PATTERN, n));
            m = m.runs(APT_GET, args);
        }
        // dnf
        m = m
            .runs(DNF, ["-q", "makecache"])
            .runs(DNF, ["-q", "versionlock", "list"])
            .runs(
                DNF,
                [
                    "-q",
                    "list",
                    "--showduplicates",
                    "--disableexcludes=all",
                    NAME_PATTERN,
                ],
            )
            .runs(DNF, ["-q", "versionlock", "add", RPM_PKG_PATTERN])
            .runs(DNF, ["-q", "versionlock", "delete", NAME_PATTERN]);
        for verb in ["install", "downgrade"] {
            for n in 1..=MAX_PACKAGES {
                let mut args = vec!["-y", "--disableexcludes=all", verb];
                args.extend(std::iter::repeat_n(RPM_PKG_PATTERN, n));
                m = m.runs(DNF, args);
            }
        }
        m = m.runs(RPM, ["-q", "--qf", "%{VERSION}-%{RELEASE}", NAME_PATTERN]);
        // binary
        m.writes(binary::DEFAULT_DIR)
            .runs(binary::CHMOD, ["0755", "/usr/bin/.*.bosun-new"])
            .downloads_from("dl.k8s.io")
    }

    fn preflight(action: &Action) -> Result<Vec<Check>, PluginError> {
        let facts = facts::node()?;
        match action {
            Action::Install(p) => install_preflight(p, &facts),
            Action::Hold(p) | Action::Unhold(p) => {
                Ok(vec![match choose(p.backend, false, &facts.os) {
                    Ok(Chosen::Binary) => Check::fail(
                        "backend",
                        "hold/unhold apply to apt and dnf packages; a binary is never changed except by install",
                    ),
                    Ok(c) => {
                        return Ok(vec![
                            Check::pass(
                                "backend",
                                format!("{} on {}", c.name(), facts.os.pretty_name),
                            ),
                            backend_commands(&c),
                        ]);
                    }
                    Err(m) => Check::fail("backend", m),
                }])
            }
            Action::Rollback(p) => Ok(p
                .paths
                .iter()
                .map(|path| {
                    let prev = binary::sibling(path, "bosun-prev");
                    Check::require(
                        "previous-present",
                        std::fs::metadata(&prev).is_ok(),
                        format!("{prev} (kept by the last binary install of {path})"),
                    )
                })
                .collect()),
        }
    }

    fn run(action: Action, ctx: &RunContext) -> Result<Outcome, PluginError> {
        let facts = facts::node()?;
        match action {
            Action::Install(p) => install(&p, &facts, ctx),
            Action::Hold(p) => set_hold(&p, &facts, true, ctx),
            Action::Unhold(p) => set_hold(&p, &facts, false, ctx),
            Action::Rollback(p) => {
                let mut done = Vec::new();
                for path in &p.paths {
                    if binary::rollback(path, ctx.dry_run)? {
                        done.push(path.clone());
                    }
                }
                Ok(if ctx.dry_run {
                    Outcome::unchanged(format!(
                        "would put back the previous {}",
                        p.paths.join(", ")
                    ))
                } else {
                    Outcome::changed(format!("put back the previous {}", done.join(", ")))
                })
            }
        }
    }
}

/// The backend a step uses.
#[derive(Debug, PartialEq, Eq)]
pub enum Chosen {
    Apt,
    Dnf,
    Binary,
}

impl Chosen {
    /// The node commands this backend runs (the preflight requires each of them).
    #[must_use]
    pub fn commands(&self) -> &'static [&'static str] {
        match self {
            Chosen::Apt => &[APT_GET, APT_CACHE, APT_MARK, DPKG_QUERY],
            Chosen::Dnf => &[DNF, RPM],
            Chosen::Binary => &[binary::CHMOD],
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Chosen::Apt => "apt",
            Chosen::Dnf => "dnf",
            Chosen::Binary => "binary",
        }
    }

    fn backend(&self) -> Option<Box<dyn Backend>> {
        match self {
            Chosen::Apt => Some(Box::new(Apt)),
            Chosen::Dnf => Some(Box::new(Dnf)),
            Chosen::Binary => None,
        }
    }
}

/// Picks the backend: the step's choice, binary when binaries are listed, else by family.
///
/// # Errors
/// A message saying the family has no backend here and what to do.
pub fn choose(
    forced: Option<BackendName>,
    has_binaries: bool,
    os: &facts::OsRelease,
) -> Result<Chosen, String> {
    match forced {
        Some(BackendName::Apt) => return Ok(Chosen::Apt),
        Some(BackendName::Dnf) => return Ok(Chosen::Dnf),
        Some(BackendName::Yum) => {
            return Err(format!(
                "`backend: yum`: on RHEL 8 and later yum is dnf, so leave `backend` unset or set it to `dnf`. {NO_YUM}"
            ));
        }
        Some(BackendName::Binary) => return Ok(Chosen::Binary),
        None if has_binaries => return Ok(Chosen::Binary),
        None => {}
    }
    if os.is_like("debian") || os.is_like("ubuntu") {
        return Ok(Chosen::Apt);
    }
    if os.is_like("rhel") || os.is_like("fedora") || os.is_like("centos") {
        let major: u32 = os
            .version_id
            .split('.')
            .next()
            .and_then(|m| m.parse().ok())
            .unwrap_or(0);
        if os.is_like("fedora") && !os.is_like("rhel") || major >= 8 {
            return Ok(Chosen::Dnf);
        }
        return Err(format!(
            "no package backend for {} (ID={}, VERSION_ID={}): {NO_YUM}",
            pretty(os),
            os.id,
            os.version_id
        ));
    }
    Err(format!(
        "no package backend for {} (ID={}, ID_LIKE={}): this plugin handles apt (Debian, Ubuntu) and dnf (RHEL family 8 and later, Fedora). \
         Use `backend: binary` with `binaries`, or install a package plugin for this family (docs/plugins-first-party.md, \"Write a package backend\")",
        pretty(os),
        os.id,
        os.id_like.join(" ")
    ))
}

fn pretty(os: &facts::OsRelease) -> &str {
    if os.pretty_name.is_empty() {
        "this node"
    } else {
        &os.pretty_name
    }
}

fn bad(message: impl Into<String>) -> PluginError {
    PluginError::new("bad-params", message)
}

/// The binaries an install means: given, or derived from packages + kubernetesVersion.
fn binaries_for(p: &InstallParams, arch: &str) -> Result<Vec<BinarySpec>, PluginError> {
    if !p.binaries.is_empty() {
        return Ok(p.binaries.clone());
    }
    let version = p.kubernetes_version.as_deref().ok_or_else(|| {
        bad("the binary backend needs `binaries`, or `packages` with `kubernetesVersion`")
    })?;
    let base = p
        .base_url
        .as_deref()
        .unwrap_or(binary::DEFAULT_BASE_URL)
        .trim_end_matches('/');
    Ok(p.packages
        .iter()
        .map(|name| BinarySpec {
            name: name.clone(),
            url: format!("{base}/{version}/bin/linux/{arch}/{name}"),
            sha256: None,
            path: None,
        })
        .collect())
}

fn validate_names(packages: &[String]) -> Result<(), PluginError> {
    if packages.is_empty() {
        return Err(bad("packages is empty: name at least one package"));
    }
    if packages.len() > MAX_PACKAGES {
        return Err(bad(format!(
            "packages lists {}, at most {MAX_PACKAGES} are installed in one step",
            packages.len()
        )));
    }
    packages.iter().try_for_each(|n| backend::check_name(n))
}

/// The exact version `package` should be at.
fn wanted_version(
    b: &dyn Backend,
    package: &str,
    p: &InstallParams,
) -> Result<String, PluginError> {
    let available = b.available(package)?;
    if let Some(v) = &p.version {
        return if available.iter().any(|a| a == v) {
            Ok(v.clone())
        } else {
            Err(PluginError::new(
                "version-unavailable",
                format!(
                    "{package} {v} is not in the repositories {} knows; available: {}",
                    b.name(),
                    list(&available)
                ),
            ))
        };
    }
    let k = p
        .kubernetes_version
        .as_deref()
        .ok_or_else(|| bad("set `version` (exact package version) or `kubernetesVersion`"))?;
    let upstream = k.trim_start_matches('v');
    available.iter().find(|a| backend::upstream(a) == upstream).cloned().ok_or_else(|| {
        PluginError::new(
            "version-unavailable",
            format!("no {package} package for Kubernetes {k} in the repositories {} knows; available: {} (is the repository for v{} configured?)", b.name(), list(&available), minor(upstream)),
        )
    })
}

fn minor(v: &str) -> String {
    v.split('.').take(2).collect::<Vec<_>>().join(".")
}

fn list(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

fn install_preflight(
    p: &InstallParams,
    facts: &facts::NodeFacts,
) -> Result<Vec<Check>, PluginError> {
    let chosen = match choose(p.backend, !p.binaries.is_empty(), &facts.os) {
        Ok(c) => c,
        Err(m) => return Ok(vec![Check::fail("backend", m)]),
    };
    let mut checks = vec![
        Check::pass(
            "backend",
            format!("{} on {}", chosen.name(), facts.os.pretty_name),
        ),
        backend_commands(&chosen),
    ];
    let Some(b) = chosen.backend() else {
        match binaries_for(p, &facts.arch)
            .and_then(|specs| specs.iter().try_for_each(binary::validate))
        {
            Ok(()) => checks.push(Check::pass(
                "binaries",
                "every binary has a name, URL and valid target path",
            )),
            Err(e) => checks.push(Check::fail("binaries", e.message)),
        }
        return Ok(checks);
    };
    if let Err(e) = validate_names(&p.packages) {
        checks.push(Check::fail("params", e.message));
        return Ok(checks);
    }
    if p.version.is_none() && p.kubernetes_version.is_none() {
        checks.push(Check::fail(
            "params",
            "set `version` (exact package version) or `kubernetesVersion`",
        ));
        return Ok(checks);
    }
    // Read-only look at the current index: the run refreshes it first, so a version not
    // there yet is only a warning.
    for name in &p.packages {
        checks.push(match wanted_version(b.as_ref(), name, p) {
            Ok(v) => Check::pass("version-available", format!("{name} {v} is available")),
            Err(e) if p.update => Check::warn(
                "version-available",
                format!("{} (the run refreshes the index first)", e.message),
            ),
            Err(e) => Check::fail("version-available", e.message),
        });
    }
    Ok(checks)
}

/// The chosen backend's commands are on the node (the grants mark every backend's commands
/// optional, so the agent does not require them all).
fn backend_commands(chosen: &Chosen) -> Check {
    let problems: Vec<String> = chosen
        .commands()
        .iter()
        .filter_map(|c| command_problem(c))
        .collect();
    if problems.is_empty() {
        Check::pass(
            "backend-commands",
            format!("{} has {}", chosen.name(), chosen.commands().join(", ")),
        )
    } else {
        Check::fail(
            "backend-commands",
            format!(
                "the {} backend chosen for this node cannot run: {}",
                chosen.name(),
                problems.join("; ")
            ),
        )
    }
}

/// Why the node cannot run `command`, or `None` when it is a regular file.
///
/// The host runs a granted command only at a path with no symlink in it, so a command that
/// is a symlink on this node is as good as missing; the message names the link and what to
/// do instead.
fn command_problem(command: &str) -> Option<String> {
    match std::fs::symlink_metadata(command) {
        Ok(m) if m.is_file() => None,
        Ok(m) if m.file_type().is_symlink() => {
            let target = std::fs::read_link(command)
                .map_or_else(|_| "?".into(), |t| t.display().to_string());
            let advice = format!(
                "set `backend` to one whose command is a regular file on the node, or ask for {command} to be supported at its real path"
            );
            Some(format!(
                "{command} is a symlink to {target} here, and Bosun runs a granted command only at its real path (docs/security.md, \"Granted commands name real files\"): {advice}"
            ))
        }
        _ if command == DNF => Some(match std::fs::read_link(DNF_LINK) {
            Ok(t) if t.to_string_lossy().contains("dnf5") => format!(
                "{DNF} (dnf 4) is missing and {DNF_LINK} is {} (dnf5, Fedora 41 and later), which this plugin does not drive: install dnf 4 (`dnf install dnf4`, which provides {DNF}), or set `backend: binary`",
                t.display()
            ),
            _ => format!(
                "{DNF} (dnf 4) is missing on the node: install dnf, or set `backend` to one the node has"
            ),
        }),
        _ => Some(format!(
            "{command} is missing on the node: install the package manager, or set `backend` to one the node has"
        )),
    }
}

fn install(
    p: &InstallParams,
    facts: &facts::NodeFacts,
    ctx: &RunContext,
) -> Result<Outcome, PluginError> {
    let chosen = choose(p.backend, !p.binaries.is_empty(), &facts.os)
        .map_err(|m| PluginError::new("no-backend", m))?;
    let Some(b) = chosen.backend() else {
        return install_binaries(p, &facts.arch, ctx);
    };
    validate_names(&p.packages)?;
    if p.update && !ctx.dry_run {
        log::progress(
            0,
            3,
            &format!("{}: refreshing repository metadata", b.name()),
        );
        b.refresh()?;
    }
    let mut plan: Vec<(String, String, Option<Installed>)> = Vec::new();
    for name in &p.packages {
        let want = wanted_version(b.as_ref(), name, p)?;
        let have = b.installed(name)?;
        plan.push((name.clone(), want, have));
    }
    let to_install: Vec<&(String, String, Option<Installed>)> = plan
        .iter()
        .filter(|(_, want, have)| have.as_ref().is_none_or(|h| &h.version != want))
        .collect();
    let to_hold: Vec<&(String, String, Option<Installed>)> = plan
        .iter()
        // Whose hold state must change (a held package being upgraded stays held).
        .filter(|(_, _, have)| have.as_ref().map(|h| h.held) != Some(p.hold))
        .collect();
    let describe = |(name, want, have): &(String, String, Option<Installed>)| match have {
        Some(h) => format!("{name} {} → {want}", h.version),
        None => format!("{name} (not installed) → {want}"),
    };
    let mut outcome = Outcome::unchanged(String::new());
    for (name, want, have) in &plan {
        outcome = outcome
            .output(
                format!("{name}.before"),
                have.as_ref().map_or("none", |h| h.version.as_str()),
            )
            .output(format!("{name}.wanted"), want);
    }
    if to_install.is_empty() && to_hold.is_empty() {
        outcome.message = format!(
            "{} already at {}{}",
            p.packages.join(", "),
            plan.iter()
                .map(|(_, w, _)| w.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            if p.hold { ", held" } else { ", not held" }
        );
        return Ok(outcome);
    }
    if ctx.dry_run {
        let mut parts = Vec::new();
        if !to_install.is_empty() {
            parts.push(format!(
                "install {}",
                to_install
                    .iter()
                    .map(|e| describe(e))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if !to_hold.is_empty() {
            parts.push(format!(
                "{} {}",
                if p.hold { "hold" } else { "unhold" },
                to_hold
                    .iter()
                    .map(|(n, _, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        outcome.message = format!("would {} with {}", parts.join(" and "), b.name());
        return Ok(outcome);
    }
    if !to_install.is_empty() {
        log::progress(1, 3, "installing");
        // Release holds first: a held package is not changed by the package manager.
        for (name, _, have) in &to_install {
            if have.as_ref().is_some_and(|h| h.held) {
                b.unhold(name)?;
            }
        }
        let pairs: Vec<(String, String)> = to_install
            .iter()
            .map(|(n, w, _)| (n.clone(), w.clone()))
            .collect();
        let installed: Vec<Option<Installed>> =
            to_install.iter().map(|(_, _, h)| h.clone()).collect();
        info!(
            "{}: installing {}",
            b.name(),
            to_install
                .iter()
                .map(|e| describe(e))
                .collect::<Vec<_>>()
                .join(", ")
        );
        b.install(&pairs, &installed)?;
    }
    log::progress(2, 3, "holding");
    for (name, want, _) in &plan {
        if p.hold {
            b.hold(name, want)?;
        } else if to_hold.iter().any(|(n, _, _)| n == name) {
            b.unhold(name)?;
        }
    }
    // Verify: the package manager's own view afterwards.
    for (name, want, _) in &plan {
        let now = b.installed(name)?;
        match &now {
            Some(h) if &h.version == want => {}
            other => {
                return Err(PluginError::new(
                    "install-not-effective",
                    format!(
                        "{name} is {} after installing {want}; check the package manager's log on the node",
                        other
                            .as_ref()
                            .map_or("not installed", |h| h.version.as_str())
                    ),
                ));
            }
        }
        let h = now.unwrap_or_else(|| unreachable!());
        outcome = outcome
            .output(format!("{name}.after"), &h.version)
            .output(format!("{name}.held"), h.held);
    }
    log::progress(3, 3, "done");
    outcome.changed = true;
    outcome.message = format!(
        "{}: {}{}",
        b.name(),
        plan.iter()
            .map(|(n, w, _)| format!("{n} {w}"))
            .collect::<Vec<_>>()
            .join(", "),
        if p.hold { ", held" } else { "" }
    );
    Ok(outcome)
}

fn install_binaries(
    p: &InstallParams,
    arch: &str,
    ctx: &RunContext,
) -> Result<Outcome, PluginError> {
    let specs = binaries_for(p, arch)?;
    specs.iter().try_for_each(binary::validate)?;
    let mut outcome = Outcome::unchanged(String::new());
    let mut changed = Vec::new();
    let mut would = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        log::progress(i as u64, specs.len() as u64, &spec.name);
        let (change, digest) = binary::install(spec, ctx.dry_run)?;
        let target = spec.target();
        outcome = outcome.output(format!("{}.sha256", spec.name), &digest);
        match change {
            binary::Change::Unchanged => info!("{target} already has sha256 {digest}"),
            binary::Change::WouldReplace => would.push(target),
            binary::Change::Replaced { previous } => {
                info!(
                    "{target} replaced (sha256 {digest}); previous kept at {}",
                    previous.as_deref().unwrap_or("none (new file)")
                );
                if let Some(prev) = previous {
                    outcome = outcome.output(format!("{}.previous", spec.name), prev);
                }
                changed.push(target);
            }
        }
    }
    outcome.message = if ctx.dry_run {
        if would.is_empty() {
            "every binary already has the wanted digest".into()
        } else {
            format!("would download and replace {}", would.join(", "))
        }
    } else if changed.is_empty() {
        "every binary already has the wanted digest".into()
    } else {
        outcome.changed = true;
        format!("replaced {}", changed.join(", "))
    };
    Ok(outcome)
}

fn set_hold(
    p: &NamesParams,
    facts: &facts::NodeFacts,
    hold: bool,
    ctx: &RunContext,
) -> Result<Outcome, PluginError> {
    validate_names(&p.packages)?;
    let chosen =
        choose(p.backend, false, &facts.os).map_err(|m| PluginError::new("no-backend", m))?;
    let b = chosen
        .backend()
        .ok_or_else(|| bad("hold/unhold apply to apt and dnf packages"))?;
    let verb = if hold { "hold" } else { "unhold" };
    let mut todo = Vec::new();
    for name in &p.packages {
        let h = b.installed(name)?.ok_or_else(|| {
            PluginError::new(
                "not-installed",
                format!("{name} is not installed: nothing to {verb}"),
            )
        })?;
        if h.held != hold {
            todo.push((name.clone(), h.version));
        }
    }
    if todo.is_empty() {
        return Ok(Outcome::unchanged(format!(
            "{} already {}",
            p.packages.join(", "),
            if hold { "held" } else { "not held" }
        )));
    }
    if ctx.dry_run {
        return Ok(Outcome::unchanged(format!(
            "would {verb} {}",
            todo.iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    for (name, version) in &todo {
        if hold {
            b.hold(name, version)?
        } else {
            b.unhold(name)?
        }
    }
    Ok(Outcome::changed(format!(
        "{}: {verb} {}",
        b.name(),
        todo.iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

bosun_plugin_sdk::export_plugin!(Packages);

#[cfg(test)]
mod tests {
    use super::*;

    fn os(id: &str, like: &[&str], version: &str) -> facts::OsRelease {
        facts::OsRelease {
            id: id.into(),
            id_like: like.iter().map(|s| (*s).to_owned()).collect(),
            version_id: version.into(),
            pretty_name: format!("{id} {version}"),
        }
    }

    #[test]
    fn family_decides_the_backend() {
        assert_eq!(
            choose(None, false, &os("debian", &[], "12")),
            Ok(Chosen::Apt)
        );
        assert_eq!(
            choose(None, false, &os("ubuntu", &["debian"], "24.04")),
            Ok(Chosen::Apt)
        );
        assert_eq!(
            choose(
                None,
                false,
                &os("rocky", &["rhel", "centos", "fedora"], "9.4")
            ),
            Ok(Chosen::Dnf)
        );
        // yum 3 releases are refused with the reason and what to do, whether detected or
        // asked for; Amazon Linux 2023 (ID_LIKE=fedora, dnf) is not one of them.
        for (id, like, version) in [
            ("centos", &["rhel", "fedora"][..], "7"),
            ("amzn", &["centos", "rhel", "fedora"][..], "2"),
        ] {
            let e = choose(None, false, &os(id, like, version)).unwrap_err();
            assert!(
                e.contains(&format!(
                    "(ID={id}, VERSION_ID={version}): yum 3 (RHEL and CentOS 7"
                )),
                "{e}"
            );
            assert!(e.contains("Set `backend: binary`"), "{e}");
        }
        assert_eq!(
            choose(None, false, &os("amzn", &["fedora"], "2023")),
            Ok(Chosen::Dnf)
        );
        let e = choose(
            Some(BackendName::Yum),
            false,
            &os("rocky", &["rhel", "centos", "fedora"], "9.4"),
        )
        .unwrap_err();
        assert!(
            e.starts_with("`backend: yum`: on RHEL 8 and later yum is dnf, so leave `backend` unset or set it to `dnf`. yum 3"),
            "{e}"
        );
        assert_eq!(
            choose(None, true, &os("flatcar", &[], "4081")),
            Ok(Chosen::Binary)
        );
        let e = choose(None, false, &os("flatcar", &[], "4081")).unwrap_err();
        assert!(
            e.contains("no package backend for flatcar 4081 (ID=flatcar"),
            "{e}"
        );
        assert!(e.contains("Write a package backend"), "{e}");
    }

    #[test]
    fn planner_params_deserialize() {
        let a: Action = serde_json::from_value(serde_json::json!({
            "action": "install",
            "params": {"packages": ["kubelet", "kubectl"], "kubernetesVersion": "v1.34.2"}
        }))
        .unwrap();
        let Action::Install(p) = a else { panic!() };
        assert!(p.hold && p.update && p.backend.is_none());
    }

    #[test]
    fn derived_binaries_follow_the_release_layout() {
        let p = InstallParams {
            packages: vec!["kubeadm".into()],
            kubernetes_version: Some("v1.34.2".into()),
            ..InstallParams::default()
        };
        let b = binaries_for(&p, "amd64").unwrap();
        assert_eq!(
            b[0].url,
            "https://dl.k8s.io/release/v1.34.2/bin/linux/amd64/kubeadm"
        );
        assert_eq!(b[0].target(), "/usr/bin/kubeadm");
    }
}
