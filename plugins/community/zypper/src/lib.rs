//! `zypper`: kubeadm, kubelet and kubectl packages on SUSE and openSUSE nodes, written from
//! docs/plugins.md alone with the public SDK, as a community author would. Published with
//! `spec.backend {for: packages, osFamilies: [opensuse-leap, opensuse-tumbleweed, sles, suse]}`
//! it runs the `packages` steps of an upgrade on those nodes, beside the first-party plugin.
//!
//! Actions (the `packages` interface the planner's steps call, docs/api.md):
//! - `install` `{"packages": [...], "kubernetesVersion": "v1.34.4"}` (or `"version"`, an exact
//!   `VERSION-RELEASE`): refresh the repositories, install each package at the newest
//!   version whose upstream part is the Kubernetes version, and lock it there (`hold`,
//!   default true). Idempotent: a package already at that version and lock changes nothing.
//! - `hold` / `unhold` `{"packages": [...]}`: add or remove zypper's package lock.
//!
//! zypper takes its lock file (`/run/zypp.pid`) even to read, and a dry run cannot write, so
//! a dry run and every preflight read only `rpm -q` and `/etc/zypp/locks`: a dry run says
//! which version it would look for and what is installed, not which version the
//! repositories hold.

use bosun_plugin_sdk::exec::Command;
use bosun_plugin_sdk::prelude::*;

/// The program, never a symlink to it.
pub const ZYPPER: &str = "/usr/bin/zypper";
/// Installed versions.
pub const RPM: &str = "/usr/bin/rpm";
/// zypper's package locks (read directly: `zypper locks` needs its lock file).
pub const LOCKS: &str = "/etc/zypp/locks";
/// Options every zypper call starts with: no questions, no progress chatter.
pub const ZYPPER_OPTS: [&str; 2] = ["--non-interactive", "--quiet"];
/// Pattern of a package name argument.
pub const NAME: &str = "[a-z0-9]*";
/// Pattern of a `name=version` argument.
pub const NAME_VERSION: &str = "[a-z0-9]*=[0-9]*";
/// Most packages in one install (kubeadm, kubelet, kubectl).
pub const MAX_PACKAGES: usize = 3;
/// The os-release IDs this plugin serves.
pub const FAMILIES: [&str; 4] = ["opensuse-leap", "opensuse-tumbleweed", "sles", "suse"];

/// The actions with their params.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(tag = "action", content = "params", rename_all = "kebab-case")]
pub enum Action {
    /// Install packages at a version and lock them.
    Install(InstallParams),
    /// Lock packages at their installed version.
    Hold(NamesParams),
    /// Remove the locks.
    Unhold(NamesParams),
}

/// Params of `install`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstallParams {
    /// Package names, at most 3 (`kubeadm`, `kubelet`, `kubectl`).
    pub packages: Vec<String>,
    /// Kubernetes version, `v1.34.4`: the newest package version `1.34.4-*`.
    #[serde(default)]
    pub kubernetes_version: Option<String>,
    /// An exact `VERSION-RELEASE` for every package; overrides `kubernetesVersion`.
    #[serde(default)]
    pub version: Option<String>,
    /// Lock the packages afterwards. Default true.
    #[serde(default = "yes")]
    pub hold: bool,
    /// Accepted for the `packages` interface and ignored: zypper has one backend.
    #[serde(default)]
    pub backend: Option<String>,
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
}

/// The plugin.
pub struct Zypper;

impl Plugin for Zypper {
    type Action = Action;

    fn metadata() -> Metadata {
        let mut m = bosun_plugin_sdk::metadata!()
            .name("zypper")
            .action(
                ActionInfo::new(
                    "install",
                    "Install packages at a Kubernetes version with zypper and lock them",
                )
                .params::<InstallParams>()
                .idempotent(),
            )
            .action(
                ActionInfo::new("hold", "Lock packages at their installed version")
                    .params::<NamesParams>()
                    .idempotent(),
            )
            .action(
                ActionInfo::new("unhold", "Remove the packages' locks")
                    .params::<NamesParams>()
                    .idempotent(),
            )
            .reads("/etc/zypp")
            .runs(RPM, ["-q", "--qf", "%{VERSION}-%{RELEASE}", NAME])
            .runs(ZYPPER, [ZYPPER_OPTS[0], ZYPPER_OPTS[1], "refresh"])
            .runs(
                ZYPPER,
                [
                    ZYPPER_OPTS[0],
                    ZYPPER_OPTS[1],
                    "--no-refresh",
                    "search",
                    "--details",
                    "--match-exact",
                    NAME,
                ],
            )
            .runs(ZYPPER, [ZYPPER_OPTS[0], ZYPPER_OPTS[1], "addlock", NAME])
            .runs(ZYPPER, [ZYPPER_OPTS[0], ZYPPER_OPTS[1], "removelock", NAME]);
        for n in 1..=MAX_PACKAGES {
            let mut args = vec![
                ZYPPER_OPTS[0],
                ZYPPER_OPTS[1],
                "--no-refresh",
                "install",
                "--oldpackage",
            ];
            args.extend(std::iter::repeat_n(NAME_VERSION, n));
            m = m.runs(ZYPPER, args);
        }
        m
    }

    fn preflight(action: &Action) -> Result<Vec<Check>, PluginError> {
        let facts = bosun_plugin_sdk::facts::node()?;
        let os = &facts.os;
        let family = serves(&os.id, &os.id_like);
        let mut checks = vec![match family {
            Some(f) => Check::pass(
                "os-family",
                format!("{} (zypper serves {f})", os.pretty_name),
            ),
            None => Check::fail(
                "os-family",
                format!(
                    "{} (ID={}, ID_LIKE={}) is not a SUSE family: this plugin serves {}; publish it with \
                     spec.backend.osFamilies limited to those",
                    os.pretty_name,
                    os.id,
                    os.id_like.join(" "),
                    FAMILIES.join(", ")
                ),
            ),
        }];
        if family.is_none() {
            return Ok(checks);
        }
        let names = match action {
            Action::Install(p) => {
                target(p)?;
                &p.packages
            }
            Action::Hold(p) | Action::Unhold(p) => &p.packages,
        };
        check_names(names)?;
        checks.push(Check::pass(
            "params",
            format!("{} package(s): {}", names.len(), names.join(", ")),
        ));
        Ok(checks)
    }

    fn run(action: Action, ctx: &RunContext) -> Result<Outcome, PluginError> {
        match action {
            Action::Install(p) => install(&p, ctx),
            Action::Hold(p) => set_locks(&p.packages, true, ctx),
            Action::Unhold(p) => set_locks(&p.packages, false, ctx),
        }
    }
}

/// The first of the node's os-release ID, then ID_LIKE entries, that this plugin serves.
pub fn serves<'a>(id: &'a str, id_like: &'a [String]) -> Option<&'a str> {
    std::iter::once(id)
        .chain(id_like.iter().map(String::as_str))
        .find(|f| FAMILIES.contains(f))
}

/// What `install` aims at.
#[derive(Debug, PartialEq, Eq)]
pub enum Target {
    /// An exact `VERSION-RELEASE`.
    Exact(String),
    /// The newest `UPSTREAM-*`, for example `1.34.4`.
    Upstream(String),
}

/// The target of `install`, or a `bad-params` error saying what to give.
pub fn target(p: &InstallParams) -> Result<Target, PluginError> {
    if p.packages.is_empty() || p.packages.len() > MAX_PACKAGES {
        return Err(PluginError::new(
            "bad-params",
            format!(
                "give 1 to {MAX_PACKAGES} packages, got {}",
                p.packages.len()
            ),
        ));
    }
    match (&p.version, &p.kubernetes_version) {
        (Some(v), _) if starts_with_digit(v) && v.contains('-') => Ok(Target::Exact(v.clone())),
        (Some(v), _) => Err(PluginError::new(
            "bad-params",
            format!("version `{v}` is not a package VERSION-RELEASE such as 1.34.4-150500.1.1"),
        )),
        (None, Some(k)) => match k.strip_prefix('v') {
            Some(u) if starts_with_digit(u) && u.split('.').count() == 3 => {
                Ok(Target::Upstream(u.to_owned()))
            }
            _ => Err(PluginError::new(
                "bad-params",
                format!("kubernetesVersion `{k}` is not a Kubernetes version such as v1.34.4"),
            )),
        },
        (None, None) => Err(PluginError::new(
            "bad-params",
            "give kubernetesVersion (v1.34.4) or version (1.34.4-150500.1.1)",
        )),
    }
}

fn starts_with_digit(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_ascii_digit())
}

/// Refuses a name that is not a plain package name (no option can pass as one).
fn check_names(names: &[String]) -> Result<(), PluginError> {
    for n in names {
        let ok = !n.is_empty()
            && n.chars()
                .next()
                .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            && n.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
        if !ok {
            return Err(PluginError::new(
                "bad-params",
                format!("`{n}` is not a package name (lowercase letters, digits, -)"),
            ));
        }
    }
    Ok(())
}

/// The installed `VERSION-RELEASE` of `name`, if installed.
fn installed(name: &str) -> Result<Option<String>, PluginError> {
    let out = Command::new(RPM)
        .args(["-q", "--qf", "%{VERSION}-%{RELEASE}", name])
        .output()?;
    // rpm exits 1 and says "package NAME is not installed".
    Ok(out.success().then(|| out.stdout_text().trim().to_owned()))
}

/// The packages zypper has locked, from its locks file.
pub fn parse_locks(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("solvable_name:"))
        .map(|n| n.trim().to_owned())
        .collect()
}

fn locked() -> Result<Vec<String>, PluginError> {
    Ok(bosun_plugin_sdk::fs::read_optional(LOCKS)?
        .map(|t| parse_locks(&t))
        .unwrap_or_default())
}

/// The versions of `name` in the repositories, from `zypper search --details`.
pub fn parse_search(text: &str, name: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let cols: Vec<&str> = line.split('|').map(str::trim).collect();
            (cols.len() >= 6 && cols[1] == name && cols[2] == "package").then(|| cols[3].to_owned())
        })
        .collect()
}

/// Compares two `VERSION-RELEASE` strings by their numeric and text segments, as rpm
/// orders the usual ones (`1.34.10` after `1.34.9`).
pub fn newer(a: &str, b: &str) -> std::cmp::Ordering {
    let seg = |s: &str| -> Vec<(u64, String)> {
        s.split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|p| !p.is_empty())
            .map(|p| (p.parse().unwrap_or(0), p.to_owned()))
            .collect()
    };
    seg(a).cmp(&seg(b))
}

/// The version `install` chooses for `name` among `available`.
pub fn choose(target: &Target, available: &[String]) -> Option<String> {
    match target {
        Target::Exact(v) => available.iter().find(|a| *a == v).cloned(),
        Target::Upstream(u) => available
            .iter()
            .filter(|a| a.split_once('-').is_some_and(|(up, _)| up == u))
            .max_by(|a, b| newer(a, b))
            .cloned(),
    }
}

fn zypper(args: &[&str]) -> Result<(), PluginError> {
    Command::new(ZYPPER)
        .args(ZYPPER_OPTS)
        .args(args.iter().copied())
        .run()?;
    Ok(())
}

fn install(p: &InstallParams, ctx: &RunContext) -> Result<Outcome, PluginError> {
    let target = target(p)?;
    check_names(&p.packages)?;
    let locks = locked()?;
    let mut now = Vec::new();
    for name in &p.packages {
        now.push((name.clone(), installed(name)?));
    }
    let state =
        |n: &str, v: &Option<String>| format!("{n} {}", v.as_deref().unwrap_or("not installed"));
    if ctx.dry_run {
        let want = match &target {
            Target::Exact(v) => v.clone(),
            Target::Upstream(u) => format!("the newest {u}-*"),
        };
        let have: Vec<String> = now.iter().map(|(n, v)| state(n, v)).collect();
        return Ok(Outcome::unchanged(format!(
            "would refresh the repositories and install {want} of {} with zypper{} (now {})",
            p.packages.join(", "),
            if p.hold { ", locked" } else { "" },
            have.join(", ")
        )));
    }
    zypper(&["refresh"])?;
    let mut chosen = Vec::new();
    for name in &p.packages {
        let out = Command::new(ZYPPER)
            .args(ZYPPER_OPTS)
            .args(["--no-refresh", "search", "--details", "--match-exact", name])
            .output()?;
        let available = parse_search(&out.stdout_text(), name);
        let version = choose(&target, &available).ok_or_else(|| {
            PluginError::new(
                "version-not-available",
                format!(
                    "no version of {name} matching {target:?} in the repositories (they have: {}); \
                     add the repository that has it, or give another version",
                    if available.is_empty() {
                        "none".to_owned()
                    } else {
                        available.join(", ")
                    }
                ),
            )
        })?;
        chosen.push((name.clone(), version));
    }
    let to_install: Vec<&(String, String)> = chosen
        .iter()
        .zip(&now)
        .filter(|((_, want), (_, have))| have.as_deref() != Some(want.as_str()))
        .map(|(c, _)| c)
        .collect();
    let mut changed = false;
    if !to_install.is_empty() {
        // A lock keeps zypper from changing the package: lift it for this install.
        for (name, _) in &to_install {
            if locks.contains(name) {
                zypper(&["removelock", name])?;
            }
        }
        let args: Vec<String> = to_install.iter().map(|(n, v)| format!("{n}={v}")).collect();
        let mut cmd = Command::new(ZYPPER).args(ZYPPER_OPTS).args([
            "--no-refresh",
            "install",
            "--oldpackage",
        ]);
        for a in &args {
            cmd = cmd.arg(a);
        }
        cmd.run()?;
        changed = true;
    }
    let locks = locked()?;
    for (name, _) in &chosen {
        let is_locked = locks.contains(name);
        if p.hold && !is_locked {
            zypper(&["addlock", name])?;
            changed = true;
        } else if !p.hold && is_locked {
            zypper(&["removelock", name])?;
            changed = true;
        }
    }
    let mut outcome_parts = Vec::new();
    let mut outputs = Vec::new();
    for ((name, want), (_, before)) in chosen.iter().zip(&now) {
        let after = installed(name)?;
        if after.as_deref() != Some(want.as_str()) {
            return Err(PluginError::new(
                "install-not-effective",
                format!(
                    "zypper finished, but rpm reports {} where {want} was installed",
                    state(name, &after)
                ),
            ));
        }
        outcome_parts.push(format!("{name} {want}"));
        outputs.push((
            format!("{name}.before"),
            before.clone().unwrap_or_else(|| "none".into()),
        ));
        outputs.push((format!("{name}.after"), want.clone()));
    }
    let message = format!(
        "zypper: {}{}",
        outcome_parts.join(", "),
        if p.hold { ", locked" } else { "" }
    );
    let mut outcome = if changed {
        Outcome::changed(message)
    } else {
        Outcome::unchanged(format!(
            "already {}",
            message.trim_start_matches("zypper: ")
        ))
    };
    for (k, v) in outputs {
        outcome = outcome.output(&k, v);
    }
    Ok(outcome)
}

fn set_locks(names: &[String], lock: bool, ctx: &RunContext) -> Result<Outcome, PluginError> {
    check_names(names)?;
    let locks = locked()?;
    let verb = if lock { "lock" } else { "unlock" };
    let todo: Vec<&String> = names.iter().filter(|n| locks.contains(n) != lock).collect();
    if todo.is_empty() {
        return Ok(Outcome::unchanged(format!(
            "{} already {verb}ed",
            names.join(", ")
        )));
    }
    if ctx.dry_run {
        return Ok(Outcome::unchanged(format!(
            "would {verb} {}",
            todo.iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    for name in &todo {
        if lock && installed(name)?.is_none() {
            return Err(PluginError::new(
                "not-installed",
                format!("{name} is not installed: nothing to lock"),
            ));
        }
        zypper(&[if lock { "addlock" } else { "removelock" }, name])?;
    }
    Ok(Outcome::changed(format!(
        "zypper: {verb}ed {}",
        todo.iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

bosun_plugin_sdk::export_plugin!(Zypper);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_rows_give_the_versions_of_the_exact_package() {
        let text = "\nS  | Name    | Type    | Version           | Arch   | Repository\n\
                    ---+---------+---------+-------------------+--------+-----------\n\
                    v  | kubeadm | package | 1.34.4-150500.1.1 | noarch | test\n\
                    i+ | kubeadm | package | 1.34.3-150500.1.1 | noarch | test\n\
                       | kubeadm | srcpackage | 1.34.4-150500.1.1 | noarch | test\n";
        assert_eq!(
            parse_search(text, "kubeadm"),
            ["1.34.4-150500.1.1", "1.34.3-150500.1.1"]
        );
        assert!(parse_search(text, "kubelet").is_empty());
    }

    #[test]
    fn the_newest_release_of_the_upstream_version_is_chosen() {
        let v = |s: &[&str]| s.iter().map(|x| (*x).to_owned()).collect::<Vec<_>>();
        let available = v(&[
            "1.34.4-150500.1.1",
            "1.34.10-150500.1.1",
            "1.34.4-150500.2.1",
        ]);
        assert_eq!(
            choose(&Target::Upstream("1.34.4".into()), &available).as_deref(),
            Some("1.34.4-150500.2.1")
        );
        assert_eq!(choose(&Target::Upstream("1.34.1".into()), &available), None);
        assert_eq!(
            choose(&Target::Exact("1.34.10-150500.1.1".into()), &available).as_deref(),
            Some("1.34.10-150500.1.1")
        );
    }

    #[test]
    fn locks_files_name_their_packages() {
        let text = "\ntype: package\nmatch_type: glob\ncase_sensitive: on\nsolvable_name: kubeadm\n\n\
                    type: package\nsolvable_name: kubelet\n";
        assert_eq!(parse_locks(text), ["kubeadm", "kubelet"]);
    }

    #[test]
    fn params_say_what_is_wrong() {
        let p = |packages: &[&str], k: Option<&str>, v: Option<&str>| InstallParams {
            packages: packages.iter().map(|s| (*s).to_owned()).collect(),
            kubernetes_version: k.map(Into::into),
            version: v.map(Into::into),
            hold: true,
            backend: None,
        };
        assert_eq!(
            target(&p(&["kubeadm"], Some("v1.34.4"), None)).unwrap(),
            Target::Upstream("1.34.4".into())
        );
        assert!(
            target(&p(&["kubeadm"], Some("1.34"), None))
                .unwrap_err()
                .message
                .contains("v1.34.4")
        );
        assert!(target(&p(&[], Some("v1.34.4"), None)).is_err());
        assert!(check_names(&["--from=x".into()]).is_err());
        assert_eq!(serves("opensuse-leap", &[]), Some("opensuse-leap"));
        assert_eq!(serves("sles-sap", &["suse".into()]), Some("suse"));
        assert_eq!(serves("debian", &[]), None);
    }
}
