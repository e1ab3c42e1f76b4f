//! Node facts read from the host root: os-release, architecture, kernel, and the
//! kubeadm version (by running the node's own kubeadm, only if it is present).
//!
//! Files of the host root are read through a cap-std [`Dir`] of the root, never by
//! joining paths: a plugin with write access to `/etc` could otherwise turn
//! `etc/os-release` into a symlink to `/dev/zero` (a read that never ends) or to the
//! agent's own files. See [`read_root_file`].

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use cap_std::fs::{Dir, FileType, FileTypeExt, OpenOptions, OpenOptionsExt};

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

/// The most a fact file may hold. os-release is a few hundred bytes; anything near this
/// size is not an os-release file.
pub(crate) const MAX_FACT_FILE_BYTES: u64 = 64 << 10;

/// Reads `rel` under the host root `root`, or `None` if it is missing or refused.
///
/// Guarantees: the path and every symlink on it are resolved inside `root` only (cap-std
/// refuses absolute symlinks and `..` past the root); the file is opened non-blocking (a
/// FIFO does not hang the open) and must be a regular file (no devices, FIFOs, sockets or
/// directories); at most [`MAX_FACT_FILE_BYTES`] are read, and a larger file is refused
/// rather than parsed half. A refusal is logged as a warning and reads like a missing file;
/// a missing file is not logged.
pub(crate) fn read_root_file(root: &Path, rel: &str) -> Option<String> {
    let dir = match Dir::open_ambient_dir(root, cap_std::ambient_authority()) {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(root = %root.display(), error = %e, "node facts: cannot open the host root; facts from its files are unknown");
            return None;
        }
    };
    let refuse = |why: String| {
        tracing::warn!(root = %root.display(), file = rel, "node facts: ignoring /{rel}: {why}");
        None
    };
    let mut options = OpenOptions::new();
    options.read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    let file = match dir.open_with(rel, &options) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return refuse(format!("cannot open it inside the host root ({e}); a symlink leading out of the root is not followed")),
    };
    match file.metadata() {
        Ok(m) if m.is_file() => {}
        Ok(m) => return refuse(format!("expected a regular file, found {}", kind(m.file_type()))),
        Err(e) => return refuse(format!("cannot stat it ({e})")),
    }
    let mut bytes = Vec::new();
    if let Err(e) = file.take(MAX_FACT_FILE_BYTES + 1).read_to_end(&mut bytes) {
        return refuse(format!("reading it failed ({e})"));
    }
    if bytes.len() as u64 > MAX_FACT_FILE_BYTES {
        return refuse(format!("it is larger than {MAX_FACT_FILE_BYTES} bytes"));
    }
    match String::from_utf8(bytes) {
        Ok(text) => Some(text),
        Err(e) => refuse(format!("it is not UTF-8 ({e})")),
    }
}

/// A file type in words, for warnings.
fn kind(t: FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symlink"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "something else"
    }
}

/// Reads the facts. os-release comes from `<root>/etc/os-release` (falling back to
/// `<root>/usr/lib/os-release`); the kernel is the running kernel's (shared by every
/// root on a machine); kubeadm's version comes from running `/usr/bin/kubeadm version -o
/// short` under the root when that file exists. os-release is read by
/// [`read_root_file`]: a refused file counts as missing.
pub(crate) fn gather(root: &Path, node: &NodeContext, isolation: ExecIsolation, timeout: Duration) -> NodeFacts {
    let os_text = read_root_file(root, "etc/os-release")
        .or_else(|| read_root_file(root, "usr/lib/os-release"))
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

    fn os_id(root: &Path) -> String {
        gather(root, &NodeContext::default(), ExecIsolation::ResolveOnly, Duration::from_secs(5)).os.id
    }

    /// A root whose `usr/lib/os-release` says `ID=fallback`, so a refused
    /// `etc/os-release` shows as the fallback being used, exactly like a missing one.
    fn root_with_fallback() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("etc")).unwrap();
        std::fs::create_dir_all(dir.path().join("usr/lib")).unwrap();
        std::fs::write(dir.path().join("usr/lib/os-release"), "ID=fallback\n").unwrap();
        dir
    }

    #[test]
    fn os_release_symlinks_leading_out_of_the_root_are_not_followed() {
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("os-release");
        std::fs::write(&secret, "ID=outside\n").unwrap();
        // An absolute link would resolve against the agent's own file system; a relative
        // one climbing past the root reaches the same file.
        let abs = root_with_fallback();
        std::os::unix::fs::symlink(&secret, abs.path().join("etc/os-release")).unwrap();
        assert_eq!(os_id(abs.path()), "fallback");
        let rel = root_with_fallback();
        let up = format!("{}{}", "../".repeat(rel.path().components().count() + 1), secret.display());
        std::os::unix::fs::symlink(&up, rel.path().join("etc/os-release")).unwrap();
        assert!(rel.path().join("etc/os-release").is_file(), "the relative link does reach {}", secret.display());
        assert_eq!(os_id(rel.path()), "fallback");
        // Both links followed the plain way would have read the outside file.
        assert_eq!(std::fs::read_to_string(abs.path().join("etc/os-release")).unwrap(), "ID=outside\n");
    }

    #[test]
    fn os_release_that_is_not_a_regular_file_is_refused_without_blocking() {
        // A FIFO nobody writes to: a blocking open or read would never return.
        let fifo = root_with_fallback();
        let status = std::process::Command::new("mkfifo").arg(fifo.path().join("etc/fifo")).status().unwrap();
        assert!(status.success(), "mkfifo failed");
        std::os::unix::fs::symlink("fifo", fifo.path().join("etc/os-release")).unwrap();
        assert_eq!(os_id(fifo.path()), "fallback");
        assert_eq!(read_root_file(fifo.path(), "etc/os-release"), None);
        // A directory in its place.
        let dir = root_with_fallback();
        std::fs::create_dir(dir.path().join("etc/os-release")).unwrap();
        assert_eq!(os_id(dir.path()), "fallback");
    }

    #[test]
    fn os_release_linked_to_a_zero_device_inside_the_root_is_refused() {
        // The report's trigger: `etc/os-release -> ../dev/zero`, which stays inside the
        // root (the node's own /dev), so only the regular-file check stops an endless read.
        let root = root_with_fallback();
        std::fs::create_dir(root.path().join("dev")).unwrap();
        let zero = root.path().join("dev/zero");
        let made = std::process::Command::new("mknod").arg(&zero).args(["c", "1", "5"]).status().unwrap();
        if !made.success() {
            // mknod needs CAP_MKNOD; the FIFO test above covers the same check unprivileged.
            eprintln!("skipping: mknod of a character device is not permitted here");
            return;
        }
        std::os::unix::fs::symlink("../dev/zero", root.path().join("etc/os-release")).unwrap();
        assert_eq!(os_id(root.path()), "fallback");
    }

    #[test]
    fn os_release_larger_than_the_cap_is_refused_and_one_at_the_cap_is_read() {
        let cap = usize::try_from(MAX_FACT_FILE_BYTES).unwrap();
        let padded = |len: usize| {
            let mut text = "ID=big\n".to_owned();
            text.push_str(&"#".repeat(len - text.len() - 1));
            text.push('\n');
            assert_eq!(text.len(), len);
            text
        };
        let root = root_with_fallback();
        std::fs::write(root.path().join("etc/os-release"), padded(cap + 1)).unwrap();
        assert_eq!(os_id(root.path()), "fallback");
        std::fs::write(root.path().join("etc/os-release"), padded(cap)).unwrap();
        assert_eq!(os_id(root.path()), "big");
    }

    #[test]
    fn a_relative_os_release_symlink_inside_the_root_is_followed() {
        // The common layout: /etc/os-release -> ../usr/lib/os-release.
        let root = root_with_fallback();
        std::fs::write(root.path().join("usr/lib/os-release"), "ID=debian\nVERSION_ID=\"12\"\n").unwrap();
        std::os::unix::fs::symlink("../usr/lib/os-release", root.path().join("etc/os-release")).unwrap();
        let os = gather(root.path(), &NodeContext::default(), ExecIsolation::ResolveOnly, Duration::from_secs(5)).os;
        assert_eq!((os.id.as_str(), os.version_id.as_str()), ("debian", "12"));
    }
}
