//! The package-manager side of the plugin: one [`Backend`] per family (apt for Debian and
//! Ubuntu, dnf for the RHEL family), each a thin layer of granted commands. The install
//! logic in `lib.rs` is written once against this trait; adding a family means writing one
//! more implementation (see docs/plugins-first-party.md, "Write a package backend").

use bosun_plugin_sdk::PluginError;
use bosun_plugin_sdk::exec::Command;

/// A package as installed on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed {
    /// The package manager's version string (`1.34.2-1.1`).
    pub version: String,
    /// True when the package manager will not change it (apt hold, dnf versionlock).
    pub held: bool,
}

/// What the install logic needs from a package manager.
pub trait Backend {
    /// Short name for messages: `apt`, `dnf`.
    fn name(&self) -> &'static str;
    /// Refresh the repository metadata (`apt-get update`, `dnf makecache`).
    fn refresh(&self) -> Result<(), PluginError>;
    /// The installed version and hold state of `package`, `None` when not installed.
    fn installed(&self, package: &str) -> Result<Option<Installed>, PluginError>;
    /// Versions of `package` the repositories offer, best first.
    fn available(&self, package: &str) -> Result<Vec<String>, PluginError>;
    /// Install exactly these (name, version) pairs in one transaction; upgrades and
    /// downgrades alike. Held packages have been released before.
    fn install(
        &self,
        packages: &[(String, String)],
        installed: &[Option<Installed>],
    ) -> Result<(), PluginError>;
    /// Keep `package` at its installed version.
    fn hold(&self, package: &str, version: &str) -> Result<(), PluginError>;
    /// Let the package manager change `package` again.
    fn unhold(&self, package: &str) -> Result<(), PluginError>;
}

/// The upstream part of a package version: epoch and Debian/RPM release removed
/// (`1:1.34.2-1.1` → `1.34.2`), what `kubernetesVersion` is matched against.
#[must_use]
pub fn upstream(version: &str) -> &str {
    let v = version.split_once(':').map_or(version, |(_, rest)| rest);
    v.rsplit_once('-').map_or(v, |(up, _)| up)
}

/// Most packages these backends handle are the Kubernetes ones; names are plain.
pub fn check_name(package: &str) -> Result<(), PluginError> {
    let ok = !package.is_empty()
        && package.len() <= 128
        && package.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && package
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "+-._".contains(c));
    if ok {
        Ok(())
    } else {
        Err(PluginError::new(
            "bad-params",
            format!("`{package}` is not a package name (lowercase letters, digits, + - . _)"),
        ))
    }
}

// ---------------------------------------------------------------------------------------
// apt

/// `apt-get` (install, update).
pub const APT_GET: &str = "/usr/bin/apt-get";
/// `apt-cache` (madison: versions in the repositories).
pub const APT_CACHE: &str = "/usr/bin/apt-cache";
/// `apt-mark` (hold, unhold).
pub const APT_MARK: &str = "/usr/bin/apt-mark";
/// `dpkg-query` (installed version and selection state).
pub const DPKG_QUERY: &str = "/usr/bin/dpkg-query";
/// The query format `installed` asks dpkg-query for.
pub const DPKG_FORMAT: &str = "-f=${Status}|${Version}";
/// Options that keep dpkg from prompting about changed configuration files (no terminal).
pub const APT_INSTALL_OPTS: [&str; 7] = [
    "-q",
    "-y",
    "-o",
    "Dpkg::Options::=--force-confdef",
    "-o",
    "Dpkg::Options::=--force-confold",
    "--allow-downgrades",
];
/// Pattern for one `name=version` argument of `apt-get install`.
pub const APT_PKG_PATTERN: &str = "[a-z0-9]*=[0-9]*";
/// Pattern for a package name argument.
pub const NAME_PATTERN: &str = "[a-z0-9]*";
/// Largest number of packages installed in one transaction (one grant pattern each).
pub const MAX_PACKAGES: usize = 4;

/// Debian and Ubuntu.
#[derive(Debug)]
pub struct Apt;

impl Backend for Apt {
    fn name(&self) -> &'static str {
        "apt"
    }

    fn refresh(&self) -> Result<(), PluginError> {
        Command::new(APT_GET).args(["-q", "update"]).run()?;
        Ok(())
    }

    fn installed(&self, package: &str) -> Result<Option<Installed>, PluginError> {
        let out = Command::new(DPKG_QUERY)
            .args(["-W", DPKG_FORMAT, package])
            .output()?;
        if !out.success() {
            // "no packages found matching NAME": dpkg has never heard of it.
            return Ok(None);
        }
        Ok(parse_dpkg_status(&out.stdout_text()))
    }

    fn available(&self, package: &str) -> Result<Vec<String>, PluginError> {
        let out = Command::new(APT_CACHE).args(["madison", package]).run()?;
        Ok(parse_madison(&out.stdout_text(), package))
    }

    fn install(
        &self,
        packages: &[(String, String)],
        _installed: &[Option<Installed>],
    ) -> Result<(), PluginError> {
        let mut cmd = Command::new(APT_GET).args(APT_INSTALL_OPTS).arg("install");
        for (name, version) in packages {
            cmd = cmd.arg(format!("{name}={version}"));
        }
        cmd.run()?;
        Ok(())
    }

    fn hold(&self, package: &str, _version: &str) -> Result<(), PluginError> {
        Command::new(APT_MARK).args(["hold", package]).run()?;
        Ok(())
    }

    fn unhold(&self, package: &str) -> Result<(), PluginError> {
        Command::new(APT_MARK).args(["unhold", package]).run()?;
        Ok(())
    }
}

/// Parses `dpkg-query -W -f='${Status}|${Version}'`: `hold ok installed|1.2-1`.
#[must_use]
pub fn parse_dpkg_status(text: &str) -> Option<Installed> {
    let (status, version) = text.trim().split_once('|')?;
    let words: Vec<&str> = status.split_whitespace().collect();
    if words.get(2) != Some(&"installed") || version.is_empty() {
        return None;
    }
    Some(Installed {
        version: version.to_owned(),
        held: words[0] == "hold",
    })
}

/// Parses `apt-cache madison NAME`: ` NAME | 1.2-1 | file:/repo ./ Packages`.
#[must_use]
pub fn parse_madison(text: &str, package: &str) -> Vec<String> {
    let mut versions: Vec<String> = Vec::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split('|').map(str::trim).collect();
        if cols.len() >= 3 && cols[0] == package && !versions.iter().any(|v| v == cols[1]) {
            versions.push(cols[1].to_owned());
        }
    }
    versions
}

// ---------------------------------------------------------------------------------------
// dnf

/// dnf 4 at its real path. On RHEL 8–10, Rocky, Alma, CentOS Stream and Fedora up to 40,
/// `/usr/bin/dnf` and `/usr/bin/yum` are both symlinks to `dnf-3`, and the host runs a
/// granted command only at a path with no symlink in it (a plugin may have made one), so
/// the grant and the backend name `dnf-3` itself.
pub const DNF: &str = "/usr/bin/dnf-3";
/// Where the RHEL family's `dnf` command lives; a symlink to `dnf-3` (dnf 4) or, from
/// Fedora 41, to `dnf5`. Read only to explain a missing backend, never run.
pub const DNF_LINK: &str = "/usr/bin/dnf";
/// `rpm` (installed version).
pub const RPM: &str = "/usr/bin/rpm";
/// Pattern for one `name-version` argument of `dnf install`.
pub const RPM_PKG_PATTERN: &str = "[a-z0-9]*-[0-9]*";

/// RHEL, Rocky, Alma, CentOS Stream, Fedora (8 and later; Fedora up to 40, or with dnf 4
/// installed beside dnf5): dnf 4.
///
/// Holding uses the versionlock plugin when it is installed. The Kubernetes repositories
/// (pkgs.k8s.io) instead hold the packages by an `exclude=` line in the repository file;
/// installs therefore pass `--disableexcludes=all`, and a node without versionlock keeps
/// relying on that `exclude=` (the plugin says so in its log).
#[derive(Debug)]
pub struct Dnf;

impl Dnf {
    fn versionlock_available(&self) -> bool {
        Command::new(DNF)
            .args(["-q", "versionlock", "list"])
            .output()
            .is_ok_and(|o| o.success())
    }
}

impl Backend for Dnf {
    fn name(&self) -> &'static str {
        "dnf"
    }

    fn refresh(&self) -> Result<(), PluginError> {
        Command::new(DNF).args(["-q", "makecache"]).run()?;
        Ok(())
    }

    fn installed(&self, package: &str) -> Result<Option<Installed>, PluginError> {
        let out = Command::new(RPM)
            .args(["-q", "--qf", "%{VERSION}-%{RELEASE}", package])
            .output()?;
        if !out.success() {
            return Ok(None);
        }
        let version = out.stdout_text().trim().to_owned();
        let held = self.versionlock_available() && {
            let list = Command::new(DNF)
                .args(["-q", "versionlock", "list"])
                .run()?;
            list.stdout_text().lines().any(|l| locks(l.trim(), package))
        };
        Ok(Some(Installed { version, held }))
    }

    fn available(&self, package: &str) -> Result<Vec<String>, PluginError> {
        let out = Command::new(DNF)
            .args([
                "-q",
                "list",
                "--showduplicates",
                "--disableexcludes=all",
                package,
            ])
            .run()?;
        Ok(parse_dnf_list(&out.stdout_text(), package))
    }

    fn install(
        &self,
        packages: &[(String, String)],
        installed: &[Option<Installed>],
    ) -> Result<(), PluginError> {
        // dnf installs upgrades with `install` and downgrades with `downgrade`.
        let (down, up): (Vec<_>, Vec<_>) =
            packages
                .iter()
                .zip(installed)
                .partition(|((_, want), have)| {
                    have.as_ref()
                        .is_some_and(|h| version_cmp(want, &h.version) == std::cmp::Ordering::Less)
                });
        for (verb, set) in [("install", up), ("downgrade", down)] {
            if set.is_empty() {
                continue;
            }
            let mut cmd = Command::new(DNF).args(["-y", "--disableexcludes=all", verb]);
            for ((name, version), _) in set {
                cmd = cmd.arg(format!("{name}-{version}"));
            }
            cmd.run()?;
        }
        Ok(())
    }

    fn hold(&self, package: &str, version: &str) -> Result<(), PluginError> {
        if !self.versionlock_available() {
            bosun_plugin_sdk::warn!(
                "{} has no versionlock plugin: {package} stays held only by an `exclude=` line in its repository file (as pkgs.k8s.io's has); install python3-dnf-plugin-versionlock to hold explicitly",
                self.name()
            );
            return Ok(());
        }
        Command::new(DNF)
            .args(["-q", "versionlock", "add"])
            .arg(format!("{package}-{version}"))
            .run()?;
        Ok(())
    }

    fn unhold(&self, package: &str) -> Result<(), PluginError> {
        if !self.versionlock_available() {
            return Ok(());
        }
        Command::new(DNF)
            .args(["-q", "versionlock", "delete", package])
            .run()?;
        Ok(())
    }
}

/// Whether a `dnf versionlock list` line (`NAME-EPOCH:VERSION-RELEASE.*`) locks `package`
/// (and not another package whose name starts the same).
#[must_use]
pub fn locks(line: &str, package: &str) -> bool {
    line.strip_prefix(package)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
}

/// Parses `dnf list --showduplicates NAME`: `NAME.ARCH  VERSION-RELEASE  REPO`, best first.
#[must_use]
pub fn parse_dnf_list(text: &str, package: &str) -> Vec<String> {
    let mut versions: Vec<String> = Vec::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() >= 2 && cols[0].rsplit_once('.').is_some_and(|(n, _)| n == package) {
            let v = cols[1]
                .split_once(':')
                .map_or(cols[1], |(_, rest)| rest)
                .to_owned();
            if !versions.contains(&v) {
                versions.push(v);
            }
        }
    }
    versions.sort_by(|a, b| version_cmp(b, a));
    versions
}

/// Compares versions segment by segment: runs of digits numerically, other runs as text.
/// Enough to order the releases of one package (not a full rpmvercmp/dpkg comparison).
#[must_use]
pub fn version_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    fn segments(s: &str) -> Vec<(bool, &str)> {
        let mut out = Vec::new();
        let mut start = None;
        let mut digits = false;
        for (i, c) in s.char_indices() {
            let is_alnum = c.is_ascii_alphanumeric();
            match start {
                Some(st) if is_alnum && c.is_ascii_digit() == digits => {
                    let _ = st;
                }
                Some(st) => {
                    out.push((digits, &s[st..i]));
                    start = is_alnum.then_some(i);
                    digits = c.is_ascii_digit();
                }
                None if is_alnum => {
                    start = Some(i);
                    digits = c.is_ascii_digit();
                }
                None => {}
            }
        }
        if let Some(st) = start {
            out.push((digits, &s[st..]));
        }
        out
    }
    let (sa, sb) = (segments(a), segments(b));
    for (x, y) in sa.iter().zip(&sb) {
        let ord = match (x.0, y.0) {
            (true, true) => {
                let (xs, ys) = (x.1.trim_start_matches('0'), y.1.trim_start_matches('0'));
                xs.len().cmp(&ys.len()).then_with(|| xs.cmp(ys))
            }
            (false, false) => x.1.cmp(y.1),
            (true, false) => std::cmp::Ordering::Greater,
            (false, true) => std::cmp::Ordering::Less,
        };
        if ord != std::cmp::Ordering::Equal {
            return ord;
        }
    }
    sa.len().cmp(&sb.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Ordering;

    #[test]
    fn upstream_strips_epoch_and_release() {
        assert_eq!(upstream("1.34.2-1.1"), "1.34.2");
        assert_eq!(upstream("1:1.34.2-1.1"), "1.34.2");
        assert_eq!(upstream("1.34.2-150500.1.1"), "1.34.2");
        assert_eq!(upstream("1.34.2"), "1.34.2");
    }

    #[test]
    fn dpkg_status_lines() {
        assert_eq!(
            parse_dpkg_status("hold ok installed|1.2-1"),
            Some(Installed {
                version: "1.2-1".into(),
                held: true
            })
        );
        assert_eq!(
            parse_dpkg_status("install ok installed|1.2-1"),
            Some(Installed {
                version: "1.2-1".into(),
                held: false
            })
        );
        assert_eq!(parse_dpkg_status("deinstall ok config-files|1.2-1"), None);
        assert_eq!(parse_dpkg_status("unknown ok not-installed|"), None);
    }

    #[test]
    fn madison_and_dnf_lists() {
        let m = " kubeadm | 1.34.2-1.1 | https://pkgs.k8s.io/core:/stable:/v1.34/deb  Packages\n kubeadm | 1.34.1-1.1 | https://pkgs.k8s.io/core:/stable:/v1.34/deb  Packages\n";
        assert_eq!(parse_madison(m, "kubeadm"), ["1.34.2-1.1", "1.34.1-1.1"]);
        let d = "Available Packages\nkubeadm.x86_64   1.34.1-150500.1.1   kubernetes\nkubeadm.x86_64   1.34.10-150500.1.1   kubernetes\nkubeadm.x86_64   1.34.2-150500.1.1   kubernetes\n";
        assert_eq!(
            parse_dnf_list(d, "kubeadm"),
            [
                "1.34.10-150500.1.1",
                "1.34.2-150500.1.1",
                "1.34.1-150500.1.1"
            ]
        );
    }

    #[test]
    fn versionlock_lines_name_one_package() {
        assert!(locks("kubeadm-0:1.34.2-150500.1.1.*", "kubeadm"));
        assert!(!locks("kubeadm-extra-0:1.0-1.*", "kubeadm"));
        assert!(!locks("kubelet-0:1.34.2-150500.1.1.*", "kubeadm"));
    }

    #[test]
    fn versions_compare_numerically() {
        assert_eq!(version_cmp("1.34.10-1.1", "1.34.9-1.1"), Ordering::Greater);
        assert_eq!(version_cmp("1.0-1", "1.0-1"), Ordering::Equal);
        assert_eq!(version_cmp("1.0-1", "2.0-1"), Ordering::Less);
    }

    #[test]
    fn package_names_are_checked() {
        assert!(check_name("kubeadm").is_ok());
        assert!(check_name("libc6").is_ok());
        assert!(check_name("-o").is_err());
        assert!(check_name("foo=1").is_err());
        assert!(check_name("").is_err());
    }
}
