//! The agent's built-in preflight checks, run before every plugin step beside the plugin's
//! own checks.
//!
//! - `agent/disk-space`: free space on the file system holding the host root is at least
//!   [`Settings::min_free_bytes`];
//! - `agent/host-binaries`: every command the plugin's exec grants name exists under the
//!   host root as an executable file reached through no symlink (a plugin granted `/usr/bin/kubeadm` on a node
//!   without kubeadm would fail half-way otherwise), except commands granted
//!   `optional: true` (those of other OS families' package managers), which are only
//!   listed; and the service manager's program (`/usr/bin/systemctl`, or OpenRC's
//!   `/sbin/rc-service`) when the plugin has service grants and the agent drives a real one;
//! - `agent/node-ready`: the Node's Ready condition is True;
//! - `agent/kubelet-skew`: the kubelet is not newer than the API server and at most
//!   [`MAX_KUBELET_MINOR_SKEW`] minor versions older (the Kubernetes version-skew policy).
//!
//! Any `fail` stops the node before the plugin is even loaded: the task is Blocked with
//! reason PreflightFailed and every result is in the step's status. A check that cannot
//! tell (no kubelet version reported) says `warn`, never `pass`. The checks are plain
//! functions of what the agent read, unit-tested without a cluster.

use std::path::{Component, Path};

use bosun_api::grants::Grants;
use bosun_policy::input::{CheckStatus, PreflightResult};

/// The `source` of built-in results in the step policy input.
pub const SOURCE: &str = "agent";

/// The kubelet may be this many minor versions older than the API server (Kubernetes'
/// skew policy since 1.28).
pub const MAX_KUBELET_MINOR_SKEW: u64 = 3;

/// Thresholds of the built-in checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Least free space under the host root for a step to start.
    pub min_free_bytes: u64,
    /// The program service grants need on the node: the service backend's
    /// ([`bosun_host::ServiceBackend::program`]); `None` when the agent simulates services
    /// (`--service-backend=simulated`, the lab).
    pub service_program: Option<&'static str>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            min_free_bytes: 1024 * 1024 * 1024,
            service_program: Some(SYSTEMCTL),
        }
    }
}

/// What the checks look at.
#[derive(Clone, Copy, Debug)]
pub struct Facts<'a> {
    pub host_root: &'a Path,
    pub grants: &'a Grants,
    /// The Node's Ready condition; `None` when the Node could not be read.
    pub node_ready: Option<bool>,
    pub kubelet_version: Option<&'a str>,
    pub api_server_version: Option<&'a str>,
}

/// Runs every built-in check.
pub fn run_all(settings: Settings, facts: &Facts<'_>) -> Vec<PreflightResult> {
    vec![
        disk_space(facts.host_root, settings.min_free_bytes),
        host_binaries(facts.host_root, facts.grants, settings.service_program),
        node_ready(facts.node_ready),
        kubelet_skew(facts.kubelet_version, facts.api_server_version),
    ]
}

fn result(name: &str, status: CheckStatus, message: String) -> PreflightResult {
    PreflightResult {
        name: format!("{SOURCE}/{name}"),
        status,
        message,
        source: SOURCE.into(),
    }
}

/// Free space on the file system of `root`.
pub fn disk_space(root: &Path, min_free_bytes: u64) -> PreflightResult {
    match rustix::fs::statvfs(root) {
        Ok(s) => {
            let free = s.f_bavail.saturating_mul(s.f_frsize);
            disk_verdict(root, free, min_free_bytes)
        }
        Err(e) => result(
            "disk-space",
            CheckStatus::Fail,
            format!(
                "cannot read the free space of {}: {e}; check that the host root is mounted",
                root.display()
            ),
        ),
    }
}

fn disk_verdict(root: &Path, free: u64, min: u64) -> PreflightResult {
    let gib = |b: u64| b as f64 / (1024.0 * 1024.0 * 1024.0);
    if free >= min {
        result(
            "disk-space",
            CheckStatus::Pass,
            format!(
                "{} has {:.1} GiB free (at least {:.1} GiB needed)",
                root.display(),
                gib(free),
                gib(min)
            ),
        )
    } else {
        result(
            "disk-space",
            CheckStatus::Fail,
            format!(
                "{} has {:.2} GiB free, below the {:.1} GiB a step needs: free space on the node, then retry",
                root.display(),
                gib(free),
                gib(min)
            ),
        )
    }
}

/// The command systemd units are driven with.
pub const SYSTEMCTL: &str = "/usr/bin/systemctl";

/// Every exec-granted command that is not `optional` exists under `root` as an executable
/// file, and so does `service_program` when the plugin has service grants (`None`: the
/// agent simulates services).
pub fn host_binaries(
    root: &Path,
    grants: &Grants,
    service_program: Option<&str>,
) -> PreflightResult {
    // (command, why it is needed, optional)
    let mut needed: Vec<(&str, &str, bool)> = grants
        .exec
        .iter()
        .map(|g| (g.command.as_str(), "exec grant", g.optional))
        .collect();
    if let Some(program) = service_program.filter(|_| !grants.services.is_empty()) {
        needed.push((program, "service grants", false));
    }
    if needed.is_empty() {
        let services = if grants.services.is_empty() {
            ""
        } else {
            " (its service grants are simulated by this agent: --service-backend=simulated)"
        };
        return result(
            "host-binaries",
            CheckStatus::Pass,
            format!("the plugin is granted no host commands{services}"),
        );
    }
    let mut missing = Vec::new();
    let mut present = Vec::new();
    let mut optional_absent = Vec::new();
    for (command, why, optional) in needed {
        let problem = match under_root(command) {
            None => Some(format!("{command} (not an absolute path without `..`)")),
            Some(relative) => match symlink_on_the_way(root, relative) {
                Some(link) => Some(format!(
                    "{command} (goes through the symlink {link}: the host runs a granted command only at a path without symlinks; grant the real path)"
                )),
                None => match std::fs::symlink_metadata(root.join(relative)) {
                    Ok(m) if m.is_file() && is_executable(&m) => None,
                    Ok(_) => Some(format!("{command} (not an executable file)")),
                    Err(_) if why == "service grants" => {
                        Some(format!("{command} (needed for the service grants)"))
                    }
                    Err(_) => Some(command.to_owned()),
                },
            },
        };
        match problem {
            None => present.push(command),
            Some(p) if optional => optional_absent.push(p),
            Some(p) => missing.push(p),
        }
    }
    let absent = if optional_absent.is_empty() {
        String::new()
    } else {
        format!(
            "; absent but optional (the plugin checks what it uses): {}",
            optional_absent.join(", ")
        )
    };
    if missing.is_empty() {
        result(
            "host-binaries",
            CheckStatus::Pass,
            format!(
                "present: {}{absent}",
                if present.is_empty() {
                    "none".to_owned()
                } else {
                    present.join(", ")
                }
            ),
        )
    } else {
        result(
            "host-binaries",
            CheckStatus::Fail,
            format!(
                "granted commands missing on the node: {}; install them (or remove the grant, or mark it \
                 `optional: true` if the node does not need it by design), then retry{absent}",
                missing.join(", ")
            ),
        )
    }
}

fn under_root(command: &str) -> Option<&Path> {
    let path = Path::new(command);
    let relative = path.strip_prefix("/").ok()?;
    relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then_some(relative)
}

/// The first symlink met walking `relative` beneath `root` one component at a time, as
/// `/LINK -> TARGET`; `None` when there is none (or a component is missing).
fn symlink_on_the_way(root: &Path, relative: &Path) -> Option<String> {
    let mut prefix = std::path::PathBuf::new();
    for c in relative.components() {
        prefix.push(c);
        let meta = std::fs::symlink_metadata(root.join(&prefix)).ok()?;
        if meta.file_type().is_symlink() {
            let target = std::fs::read_link(root.join(&prefix))
                .map_or_else(|_| "?".into(), |t| t.display().to_string());
            return Some(format!("/{} -> {target}", prefix.display()));
        }
    }
    None
}

fn is_executable(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    m.permissions().mode() & 0o111 != 0
}

/// The Node is Ready.
pub fn node_ready(ready: Option<bool>) -> PreflightResult {
    match ready {
        Some(true) => result("node-ready", CheckStatus::Pass, "the Node is Ready".into()),
        Some(false) => result(
            "node-ready",
            CheckStatus::Fail,
            "the Node is not Ready: changing an unhealthy node can make it worse; bring it back to Ready, then retry".into(),
        ),
        None => result("node-ready", CheckStatus::Fail, "the Node object could not be read, so its readiness is unknown; retry when the API server answers".into()),
    }
}

fn minor_of(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.trim().trim_start_matches('v').split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts
        .next()?
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    Some((major, minor))
}

/// The kubelet's version is within the supported skew of the API server's.
pub fn kubelet_skew(kubelet: Option<&str>, api_server: Option<&str>) -> PreflightResult {
    let (Some(k), Some(a)) = (
        kubelet.filter(|s| !s.is_empty()),
        api_server.filter(|s| !s.is_empty()),
    ) else {
        return result(
            "kubelet-skew",
            CheckStatus::Warn,
            format!(
                "skew not checked: kubelet version {}, API server version {}",
                kubelet.filter(|s| !s.is_empty()).unwrap_or("unknown"),
                api_server.filter(|s| !s.is_empty()).unwrap_or("unknown")
            ),
        );
    };
    let (Some((km, kn)), Some((am, an))) = (minor_of(k), minor_of(a)) else {
        return result(
            "kubelet-skew",
            CheckStatus::Warn,
            format!("skew not checked: cannot read versions {k} and {a}"),
        );
    };
    if km != am {
        return result(
            "kubelet-skew",
            CheckStatus::Fail,
            format!("kubelet {k} and API server {a} differ in major version"),
        );
    }
    if kn > an {
        result(
            "kubelet-skew",
            CheckStatus::Fail,
            format!(
                "kubelet {k} is newer than the API server {a}, which Kubernetes does not support: upgrade the control plane first"
            ),
        )
    } else if an - kn > MAX_KUBELET_MINOR_SKEW {
        result(
            "kubelet-skew",
            CheckStatus::Fail,
            format!(
                "kubelet {k} is {} minor versions behind the API server {a} (at most {MAX_KUBELET_MINOR_SKEW} are supported): upgrade this node's kubelet step by step",
                an - kn
            ),
        )
    } else {
        result(
            "kubelet-skew",
            CheckStatus::Pass,
            format!("kubelet {k} is within the supported skew of the API server {a}"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bosun_api::grants::ExecGrant;

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

    #[test]
    fn disk_space_passes_above_and_fails_below_the_threshold() {
        let root = Path::new("/host");
        assert_eq!(
            disk_verdict(root, 2 << 30, 1 << 30).status,
            CheckStatus::Pass
        );
        let low = disk_verdict(root, 100 << 20, 1 << 30);
        assert_eq!(low.status, CheckStatus::Fail);
        assert!(low.message.contains("0.10 GiB free"), "{}", low.message);
        assert_eq!(low.name, "agent/disk-space");
        assert_eq!(low.source, "agent");
        // the real file system of a temporary directory: some space, never u64::MAX
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(disk_space(dir.path(), 1).status, CheckStatus::Pass);
        assert_eq!(disk_space(dir.path(), u64::MAX).status, CheckStatus::Fail);
        assert_eq!(
            disk_space(&dir.path().join("missing"), 1).status,
            CheckStatus::Fail
        );
    }

    #[test]
    fn granted_commands_must_exist_under_the_host_root_and_be_executable() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("usr/bin")).unwrap();
        let kubeadm = dir.path().join("usr/bin/kubeadm");
        std::fs::write(&kubeadm, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&kubeadm, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.path().join("usr/bin/notes"), "x").unwrap();
        let grants = |cmds: &[&str]| Grants {
            exec: cmds.iter().map(|c| exec(c)).collect(),
            ..Grants::default()
        };
        assert_eq!(
            host_binaries(dir.path(), &Grants::default(), Some(SYSTEMCTL)).status,
            CheckStatus::Pass
        );
        assert_eq!(
            host_binaries(dir.path(), &grants(&["/usr/bin/kubeadm"]), Some(SYSTEMCTL)).status,
            CheckStatus::Pass
        );
        let r = host_binaries(
            dir.path(),
            &grants(&[
                "/usr/bin/kubeadm",
                "/usr/bin/kubectl",
                "/usr/bin/notes",
                "/usr/../etc/passwd",
            ]),
            Some(SYSTEMCTL),
        );
        assert_eq!(r.status, CheckStatus::Fail);
        assert!(r.message.contains("/usr/bin/kubectl"), "{}", r.message);
        assert!(
            r.message
                .contains("/usr/bin/notes (not an executable file)"),
            "{}",
            r.message
        );
        assert!(
            r.message
                .contains("/usr/../etc/passwd (not an absolute path"),
            "{}",
            r.message
        );
        assert!(!r.message.contains("/usr/bin/kubeadm,"), "{}", r.message);
    }

    #[test]
    fn optional_commands_may_be_missing_and_service_grants_need_systemctl() {
        use bosun_api::grants::{ServiceAction, ServiceGrant};
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("usr/bin")).unwrap();
        let apt = dir.path().join("usr/bin/apt-get");
        std::fs::write(&apt, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&apt, std::fs::Permissions::from_mode(0o755)).unwrap();
        // A Debian node: apt present, dnf absent; both optional (one Plugin, a mixed fleet).
        let optional = |c: &str| ExecGrant {
            optional: true,
            ..exec(c)
        };
        let packages = Grants {
            exec: vec![optional("/usr/bin/apt-get"), optional("/usr/bin/dnf")],
            ..Grants::default()
        };
        let r = host_binaries(dir.path(), &packages, Some(SYSTEMCTL));
        assert_eq!(r.status, CheckStatus::Pass, "{}", r.message);
        assert!(
            r.message.contains("present: /usr/bin/apt-get")
                && r.message
                    .contains("absent but optional (the plugin checks what it uses): /usr/bin/dnf"),
            "{}",
            r.message
        );
        // Not optional: the same absence fails.
        let strict = Grants {
            exec: vec![exec("/usr/bin/dnf")],
            ..Grants::default()
        };
        assert_eq!(
            host_binaries(dir.path(), &strict, Some(SYSTEMCTL)).status,
            CheckStatus::Fail
        );
        // A granted command that is a symlink (RHEL's /usr/bin/dnf -> dnf-3) fails before
        // any step, naming the link, as the host would refuse to run it.
        let dnf3 = dir.path().join("usr/bin/dnf-3");
        std::fs::write(&dnf3, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&dnf3, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink("dnf-3", dir.path().join("usr/bin/dnf")).unwrap();
        let r = host_binaries(dir.path(), &strict, Some(SYSTEMCTL));
        assert_eq!(r.status, CheckStatus::Fail, "{}", r.message);
        assert!(
            r.message.contains(
                "/usr/bin/dnf (goes through the symlink /usr/bin/dnf -> dnf-3: the host runs a granted command only at a path without symlinks; grant the real path)"
            ),
            "{}",
            r.message
        );
        let real = Grants {
            exec: vec![exec("/usr/bin/dnf-3")],
            ..Grants::default()
        };
        let r = host_binaries(dir.path(), &real, Some(SYSTEMCTL));
        assert_eq!(r.status, CheckStatus::Pass, "{}", r.message);
        std::fs::remove_file(dir.path().join("usr/bin/dnf")).unwrap();
        std::fs::remove_file(&dnf3).unwrap();

        // A service grant needs systemctl, unless the agent simulates services.
        let kubelet = Grants {
            services: vec![ServiceGrant {
                unit: "kubelet.service".into(),
                actions: vec![ServiceAction::Restart],
            }],
            ..Grants::default()
        };
        let r = host_binaries(dir.path(), &kubelet, Some(SYSTEMCTL));
        assert_eq!(r.status, CheckStatus::Fail, "{}", r.message);
        assert!(
            r.message
                .contains("/usr/bin/systemctl (needed for the service grants)"),
            "{}",
            r.message
        );
        assert!(
            !r.message.contains("granted no host commands"),
            "{}",
            r.message
        );
        // On an OpenRC node it is rc-service that is needed.
        let r = host_binaries(dir.path(), &kubelet, Some("/sbin/rc-service"));
        assert!(
            r.message
                .contains("/sbin/rc-service (needed for the service grants)")
                && !r.message.contains("systemctl"),
            "{}",
            r.message
        );
        let r = host_binaries(dir.path(), &kubelet, None);
        assert_eq!(r.status, CheckStatus::Pass, "{}", r.message);
        assert!(
            r.message.contains("simulated by this agent"),
            "{}",
            r.message
        );
    }

    #[test]
    fn readiness_unknown_or_false_fails() {
        assert_eq!(node_ready(Some(true)).status, CheckStatus::Pass);
        assert_eq!(node_ready(Some(false)).status, CheckStatus::Fail);
        assert_eq!(node_ready(None).status, CheckStatus::Fail);
    }

    #[test]
    fn kubelet_skew_follows_the_kubernetes_policy() {
        let s = |k, a| kubelet_skew(Some(k), Some(a)).status;
        assert_eq!(s("v1.34.1", "v1.34.4"), CheckStatus::Pass);
        assert_eq!(s("v1.31.0", "v1.34.4"), CheckStatus::Pass);
        assert_eq!(s("v1.30.9", "v1.34.4"), CheckStatus::Fail);
        assert_eq!(s("v1.35.0", "v1.34.4"), CheckStatus::Fail);
        assert_eq!(s("v1.34.0-rc.1", "v1.34.4+k3s1"), CheckStatus::Pass);
        assert_eq!(
            kubelet_skew(None, Some("v1.34.4")).status,
            CheckStatus::Warn
        );
        assert_eq!(
            kubelet_skew(Some(""), Some("v1.34.4")).status,
            CheckStatus::Warn
        );
        assert_eq!(s("banana", "v1.34.4"), CheckStatus::Warn);
    }
}
