//! Node facts read from the host root: os-release, architecture, kernel, and the
//! kubeadm version (by running the node's own kubeadm, only if it is present).

use std::path::Path;
use std::time::Duration;

use crate::config::ExecIsolation;
use crate::exec::CommandSpec;

/// What the caller knows about the node that the host root cannot tell: its Kubernetes
/// name, roles and kubelet version (from the Node object).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeContext {
    pub node_name: String,
    /// `control-plane`, `worker`.
    pub roles: Vec<String>,
    /// `status.nodeInfo.kubeletVersion`, for example `v1.34.1`.
    pub kubelet_version: Option<String>,
}

/// The parsed parts of os-release plugins branch on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OsRelease {
    pub id: String,
    pub id_like: Vec<String>,
    pub version_id: String,
    pub pretty_name: String,
}

/// All facts of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    pub node_name: String,
    pub roles: Vec<String>,
    pub os: OsRelease,
    pub arch: String,
    pub kernel: String,
    pub kubelet_version: Option<String>,
    pub kubeadm_version: Option<String>,
}

/// Parses os-release (`KEY=value`, values optionally quoted).
pub(crate) fn parse_os_release(text: &str) -> OsRelease {
    let mut os = OsRelease::default();
    for line in text.lines() {
        let Some((k, v)) = line.trim().split_once('=') else { continue };
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|x| x.strip_suffix('"'))
            .or_else(|| v.strip_prefix('\'').and_then(|x| x.strip_suffix('\'')))
            .unwrap_or(v)
            .to_owned();
        match k {
            "ID" => os.id = v,
            "ID_LIKE" => os.id_like = v.split_whitespace().map(str::to_owned).collect(),
            "VERSION_ID" => os.version_id = v,
            "PRETTY_NAME" => os.pretty_name = v,
            _ => {}
        }
    }
    os
}

/// The architecture in Go/Kubernetes spelling.
pub(crate) fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// Reads the facts. os-release comes from `<root>/etc/os-release` (falling back to
/// `<root>/usr/lib/os-release`); the kernel is the running kernel's (shared by every
/// root on a machine); kubeadm's version comes from running `/usr/bin/kubeadm version -o
/// short` under the root when that file exists.
pub(crate) fn gather(root: &Path, node: &NodeContext, isolation: ExecIsolation, timeout: Duration) -> NodeFacts {
    let os_text = std::fs::read_to_string(root.join("etc/os-release"))
        .or_else(|_| std::fs::read_to_string(root.join("usr/lib/os-release")))
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned();
    let kubeadm_version = if root.join("usr/bin/kubeadm").is_file() {
        crate::exec::run(CommandSpec {
            root,
            isolation,
            command: "/usr/bin/kubeadm",
            args: &["version".to_owned(), "-o".to_owned(), "short".to_owned()],
            stdin: None,
            timeout,
            max_output: 4096,
        })
        .ok()
        .filter(|o| o.exit_code == 0)
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .filter(|v| !v.is_empty())
    } else {
        None
    };
    NodeFacts {
        node_name: node.node_name.clone(),
        roles: node.roles.clone(),
        os: parse_os_release(&os_text),
        arch: go_arch().to_owned(),
        kernel,
        kubelet_version: node.kubelet_version.clone(),
        kubeadm_version,
    }
}

impl crate::Host {
    /// The node's facts exactly as a plugin's `facts.node` call sees them (os-release from
    /// the host root, architecture, running kernel, and the node's own `/usr/bin/kubeadm
    /// version -o short` run with this host's exec isolation, for at most `timeout`). For
    /// the agent's own reports, so plugins, policies and status read a fact the same way.
    pub fn node_facts(&self, node: &NodeContext, timeout: Duration) -> NodeFacts {
        gather(&self.config().host_root, node, self.config().exec_isolation, timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release_is_parsed_with_and_without_quotes() {
        let os = parse_os_release(
            "NAME=\"Rocky Linux\"\nID=\"rocky\"\nID_LIKE=\"rhel centos fedora\"\nVERSION_ID=9.4\n# c\nPRETTY_NAME='Rocky Linux 9.4'\n",
        );
        assert_eq!(os.id, "rocky");
        assert_eq!(os.id_like, ["rhel", "centos", "fedora"]);
        assert_eq!(os.version_id, "9.4");
        assert_eq!(os.pretty_name, "Rocky Linux 9.4");
    }

    #[test]
    fn os_release_is_read_from_the_host_root_with_the_usr_lib_fallback() {
        let dir = tempfile::tempdir().unwrap();
        let read = |root: &Path| gather(root, &NodeContext::default(), ExecIsolation::ResolveOnly, Duration::from_secs(5)).os;
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::write(
            dir.path().join("etc/os-release"),
            "ID=debian\nID_LIKE=\"rhel fedora\"\nVERSION_ID=\"12\"\nPRETTY_NAME='Debian 12'\n",
        )
        .unwrap();
        let os = read(dir.path());
        assert_eq!(os.id, "debian");
        assert_eq!(os.id_like, vec!["rhel", "fedora"]);
        assert_eq!(os.version_id, "12");
        assert_eq!(os.pretty_name, "Debian 12");
        let usr = dir.path().join("usr-only");
        std::fs::create_dir_all(usr.join("usr/lib")).unwrap();
        std::fs::write(usr.join("usr/lib/os-release"), "ID=rocky\n").unwrap();
        assert_eq!(read(&usr).id, "rocky");
        assert_eq!(read(&dir.path().join("missing")).id, "");
    }
}
