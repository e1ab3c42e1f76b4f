//! Node facts read from the host root: os-release, architecture, kernel, the kubeadm and
//! kubectl versions and the installed Kubernetes packages.
//!
//! Nothing here executes anything: the host root holds files a plugin with a read-write
//! grant may have written, and facts need no grant, so running the node's
//! `/usr/bin/kubeadm` (or `kubectl version --client`) to ask its version would run whatever
//! a plugin put there, as the agent (root). The versions are read as data instead (see
//! [`binary_version`]): from the dpkg database, else from the version string the
//! Kubernetes build embeds in the binary. A plugin that can write those files can make the
//! fact lie, but not run code.
//!
//! Files of the host root are read through a cap-std [`Dir`] of the root, never by
//! joining paths: a plugin with write access to `/etc` could otherwise turn
//! `etc/os-release` into a symlink to `/dev/zero` (a read that never ends) or to the
//! agent's own files. See [`read_root_file`].

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use bosun_api::node_task::{KUBERNETES_PACKAGES, PackageVersion};
use cap_std::fs::{Dir, FileType, FileTypeExt, OpenOptions, OpenOptionsExt};

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
    /// The node's kubectl version, read like kubeadm's; `None` when it is not installed.
    pub kubectl_version: Option<String>,
    /// The installed packages of [`KUBERNETES_PACKAGES`] in that order, versions as dpkg
    /// records them; empty without a readable dpkg database (rpm roots included).
    pub packages: Vec<PackageVersion>,
}

/// Parses os-release (`KEY=value`, values optionally quoted).
pub(crate) fn parse_os_release(text: &str) -> OsRelease {
    let mut os = OsRelease::default();
    for line in text.lines() {
        let Some((k, v)) = line.trim().split_once('=') else {
            continue;
        };
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
    let bytes = read_root_bytes(root, rel, MAX_FACT_FILE_BYTES, false)?;
    match String::from_utf8(bytes) {
        Ok(text) => Some(text),
        Err(e) => {
            tracing::warn!(root = %root.display(), file = rel, "node facts: ignoring /{rel}: it is not UTF-8 ({e})");
            None
        }
    }
}

/// Opens `rel` under `root` as a regular file, non-blocking, resolved inside the root
/// only; with `no_symlinks`, refuses a path with a symlink in any component (see
/// [`open_dir_nofollow`]). `None` when missing or refused (refusals are logged).
fn open_root_regular(root: &Path, rel: &str, no_symlinks: bool) -> Option<std::fs::File> {
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
    options
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    let opened = if no_symlinks {
        let path = Path::new(rel);
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return refuse("not a file path".into());
        };
        match open_dir_nofollow(&dir, parent, false) {
            Ok(parent) => match parent.symlink_metadata(name) {
                Ok(m) if m.file_type().is_symlink() => {
                    return refuse("it is a symlink, which is not followed for this fact".into());
                }
                Ok(_) => {
                    options.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_NOFOLLOW);
                    parent.open_with(name, &options)
                }
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        }
    } else {
        dir.open_with(rel, &options)
    };
    let file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            return refuse(format!(
                "cannot open it inside the host root ({e}); a symlink leading out of the root is not followed"
            ));
        }
    };
    match file.metadata() {
        Ok(m) if m.is_file() => Some(file.into_std()),
        Ok(m) => refuse(format!(
            "expected a regular file, found {}",
            kind(m.file_type())
        )),
        Err(e) => refuse(format!("cannot stat it ({e})")),
    }
}

/// Reads at most `max` bytes of the regular file `rel` under `root` (see
/// [`open_root_regular`]); a larger file is refused.
pub(crate) fn read_root_bytes(
    root: &Path,
    rel: &str,
    max: u64,
    no_symlinks: bool,
) -> Option<Vec<u8>> {
    let file = open_root_regular(root, rel, no_symlinks)?;
    let mut bytes = Vec::new();
    if let Err(e) = file.take(max + 1).read_to_end(&mut bytes) {
        tracing::warn!(root = %root.display(), file = rel, "node facts: ignoring /{rel}: reading it failed ({e})");
        return None;
    }
    if bytes.len() as u64 > max {
        tracing::warn!(root = %root.display(), file = rel, "node facts: ignoring /{rel}: it is larger than {max} bytes");
        return None;
    }
    Some(bytes)
}

/// Opens the directory `rel` (relative, plain components) under the directory `dir` one
/// component at a time, refusing a component that is a symlink (whatever its target) or
/// not a directory; with `create`, missing components are created (mode 0755 less the
/// umask). Every component was checked not to be a symlink before it is entered, so the
/// directory returned is exactly `dir/rel`.
pub(crate) fn open_dir_nofollow(dir: &Dir, rel: &Path, create: bool) -> std::io::Result<Dir> {
    let mut current = dir.try_clone()?;
    let mut walked = std::path::PathBuf::new();
    for c in rel.components() {
        let name = match c {
            Component::Normal(n) => n,
            Component::CurDir => continue,
            _ => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{} has a `..`, root or prefix component", rel.display()),
                ));
            }
        };
        walked.push(name);
        let meta = match current.symlink_metadata(name) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                match current.create_dir(name) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(e),
                }
                current.symlink_metadata(name)?
            }
            other => other?,
        };
        if meta.file_type().is_symlink() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!(
                    "/{} is a symlink, which is never followed here",
                    walked.display()
                ),
            ));
        }
        if !meta.is_dir() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotADirectory,
                format!("/{} is not a directory", walked.display()),
            ));
        }
        current = current.open_dir(name)?;
    }
    Ok(current)
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

/// Largest dpkg status database read for the package facts (a node's is a few MiB).
const MAX_DPKG_STATUS_BYTES: u64 = 64 << 20;
/// Largest binary scanned for its version (a release kubeadm is about 70 MiB, kubectl 60).
const MAX_BINARY_BYTES: u64 = 512 << 20;
/// The kubeadm binary whose version is the fact.
const KUBEADM: &str = "usr/bin/kubeadm";
/// The kubectl binary whose version is the fact.
const KUBECTL: &str = "usr/bin/kubectl";
const DPKG_STATUS: &str = "var/lib/dpkg/status";

/// What identifies one version of a file for the cache: device, inode, size, mtime and
/// ctime (any write or replacement changes at least one).
type FileKey = (u64, u64, u64, i64, i64, i64, i64);

fn file_key(root: &Path, rel: &str) -> Option<FileKey> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(root.join(rel)).ok()?;
    Some((
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
    ))
}

/// The facts last read from each file, by the identity of the file they were read from
/// (the host root and the [`FileKey`], `None` where the file was missing), so that a
/// plugin asking for facts in a loop costs a `stat` per file, not a read of the dpkg
/// database or of a binary.
#[derive(Default)]
pub(crate) struct FactsCache {
    /// The Kubernetes packages of the dpkg database (`None`: no readable database).
    packages: Mutex<Option<(Sources, Option<Vec<PackageVersion>>)>>,
    /// The version embedded in each binary, by its path under the root.
    binaries: Mutex<Vec<(&'static str, Sources, Option<String>)>>,
}

/// The host root and the identity of the file a cached fact was read from.
type Sources = (PathBuf, Option<FileKey>);

impl FactsCache {
    fn packages(&self, root: &Path) -> Option<Vec<PackageVersion>> {
        let key = (root.to_path_buf(), file_key(root, DPKG_STATUS));
        if let Ok(cached) = self.packages.lock()
            && let Some((k, v)) = cached.as_ref()
            && *k == key
        {
            return v.clone();
        }
        let packages = dpkg_packages(root);
        if let Ok(mut cached) = self.packages.lock() {
            *cached = Some((key, packages.clone()));
        }
        packages
    }

    fn binary_version(&self, root: &Path, binary: &'static str) -> Option<String> {
        let key = (root.to_path_buf(), file_key(root, binary));
        if let Ok(cached) = self.binaries.lock()
            && let Some((_, k, v)) = cached.iter().find(|(b, _, _)| *b == binary)
            && *k == key
        {
            return v.clone();
        }
        let version = binary_version(root, binary);
        if let Ok(mut cached) = self.binaries.lock() {
            cached.retain(|(b, _, _)| *b != binary);
            cached.push((binary, key, version.clone()));
        }
        version
    }

    /// The version of `package`: the installed package's upstream version from the dpkg
    /// database (`packages`, already read), else the one embedded in `binary`.
    fn version(
        &self,
        root: &Path,
        packages: Option<&[PackageVersion]>,
        package: &str,
        binary: &'static str,
    ) -> Option<String> {
        packages
            .and_then(|list| list.iter().find(|p| p.name == package))
            .and_then(PackageVersion::kubernetes_version)
            .or_else(|| self.binary_version(root, binary))
    }
}

/// Whether `token` reads as a Kubernetes version: `v` MAJOR.MINOR.PATCH and an optional
/// `-pre` / `+build` suffix of `[0-9A-Za-z.+-]`, at most 64 bytes.
fn is_version(token: &[u8]) -> bool {
    if token.len() > 64 || token.first() != Some(&b'v') {
        return false;
    }
    let body = &token[1..];
    let end = body
        .iter()
        .position(|b| *b == b'-' || *b == b'+')
        .unwrap_or(body.len());
    let (core, suffix) = body.split_at(end);
    let parts: Vec<&[u8]> = core.split(|b| *b == b'.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 9 && p.iter().all(u8::is_ascii_digit))
        && suffix
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'-'))
}

/// The version of a Kubernetes binary of the node under `root` (`usr/bin/kubeadm`,
/// `usr/bin/kubectl`), read without executing anything. [`gather`] asks the dpkg database
/// first: an installed `kubeadm` package's version, `1.34.4-1.1` read as `v1.34.4`. This
/// reads the binary itself (a regular file, reached without any symlink): the version the
/// Kubernetes build sets with `-X .../version.gitVersion=v1.34.4`, which the Go linker
/// stores NUL-terminated and, being set in two packages (`k8s.io/component-base/version`
/// and `k8s.io/client-go/pkg/version`), twice in a row; else the Go build information's
/// `k8s.io/kubernetes` module version. It is what `kubeadm version -o short` and
/// `kubectl version --client` print.
///
/// `None` when the binary is absent or no version can be read. rpm databases are not read:
/// rpm 4.16+ keeps them in SQLite, older rpm in Berkeley DB, and neither has a pure-Rust
/// reader worth adding for a fact the binary already gives for upstream builds (the
/// binaries of pkgs.k8s.io's rpms embed their version); docs/security.md says why in full.
pub(crate) fn binary_version(root: &Path, binary: &str) -> Option<String> {
    let file = open_root_regular(root, binary, true)?;
    scan_go_version(file.take(MAX_BINARY_BYTES)).ok().flatten()
}

/// The installed [`KUBERNETES_PACKAGES`] of the dpkg database under `root`; `None` when
/// there is no database or it cannot be read (read by [`read_root_bytes`]: inside the
/// root, a regular file, at most [`MAX_DPKG_STATUS_BYTES`]).
pub(crate) fn dpkg_packages(root: &Path) -> Option<Vec<PackageVersion>> {
    let status = read_root_bytes(root, DPKG_STATUS, MAX_DPKG_STATUS_BYTES, false)?;
    Some(dpkg_installed(
        &String::from_utf8_lossy(&status),
        &KUBERNETES_PACKAGES,
    ))
}

/// The installed packages among `names` in a dpkg status database (stanzas whose
/// `Status` ends in ` installed`), in the order of `names`, versions as recorded.
pub(crate) fn dpkg_installed(status: &str, names: &[&str]) -> Vec<PackageVersion> {
    let mut found: Vec<PackageVersion> = Vec::new();
    for stanza in status.split("\n\n") {
        let field = |name: &str| {
            stanza.lines().find_map(|l| {
                l.strip_prefix(name)
                    .and_then(|r| r.strip_prefix(':'))
                    .map(str::trim)
            })
        };
        let Some(package) = field("Package").filter(|p| names.contains(p)) else {
            continue;
        };
        if !field("Status").is_some_and(|s| s.ends_with(" installed"))
            || found.iter().any(|p| p.name == package)
        {
            continue;
        }
        if let Some(version) = field("Version").filter(|v| !v.is_empty() && v.len() <= 128) {
            found.push(PackageVersion {
                name: package.to_owned(),
                version: version.to_owned(),
            });
        }
    }
    found.sort_by_key(|p| names.iter().position(|n| *n == p.name));
    found
}

/// Scans a Go binary for its Kubernetes version (see [`kubeadm_version`]), reading it in
/// chunks of 1 MiB.
pub(crate) fn scan_go_version(mut r: impl Read) -> std::io::Result<Option<String>> {
    const CHUNK: usize = 1 << 20;
    // Longer than any match: a twin is at most 2 × 65 bytes plus 16 of padding.
    const KEEP: usize = 256;
    let mut buf: Vec<u8> = Vec::with_capacity(CHUNK + KEEP);
    let mut from_build_info: Option<String> = None;
    // After the first chunk, the byte before the kept tail was scanned already and is
    // kept too (as index 0), so that a match right at the tail still sees its NUL.
    let mut first = 0;
    loop {
        let start = buf.len();
        buf.resize(start + CHUNK, 0);
        let mut filled = start;
        while filled < buf.len() {
            match r.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let eof = filled < buf.len();
        buf.truncate(filled);
        let limit = if eof {
            buf.len()
        } else {
            buf.len().saturating_sub(KEEP)
        };
        for p in first..limit {
            match buf[p] {
                b'v' if p > 0 && buf[p - 1] == 0 => {
                    if let Some(v) = twin_at(&buf, p) {
                        return Ok(Some(v));
                    }
                }
                b'\t' if from_build_info.is_none() => from_build_info = build_info_at(&buf, p),
                _ => {}
            }
        }
        if eof {
            return Ok(from_build_info);
        }
        buf.drain(..limit - 1);
        first = 1;
    }
}

/// A NUL-terminated version string at `p`, followed (after at most 16 NUL bytes of
/// alignment) by the same string NUL-terminated again.
fn twin_at(buf: &[u8], p: usize) -> Option<String> {
    let len = buf[p..].iter().take(66).position(|b| *b == 0)?;
    let token = &buf[p..p + len];
    if !is_version(token) {
        return None;
    }
    let mut q = p + len + 1;
    let pad_end = (q + 16).min(buf.len());
    while q < pad_end && buf[q] == 0 {
        q += 1;
    }
    (buf.get(q..q + len) == Some(token) && buf.get(q + len) == Some(&0))
        .then(|| String::from_utf8_lossy(token).into_owned())
}

/// The version in a Go build information line `mod|dep <TAB> k8s.io/kubernetes <TAB>
/// vX.Y.Z <TAB|NL>` whose first tab is at `p`.
fn build_info_at(buf: &[u8], p: usize) -> Option<String> {
    const MODULE: &[u8] = b"\tk8s.io/kubernetes\t";
    if !buf[p..].starts_with(MODULE)
        || !(p >= 3 && (&buf[p - 3..p] == b"mod" || &buf[p - 3..p] == b"dep"))
    {
        return None;
    }
    let rest = &buf[p + MODULE.len()..];
    let end = rest
        .iter()
        .take(66)
        .position(|b| *b == b'\t' || *b == b'\n')?;
    let token = &rest[..end];
    is_version(token).then(|| String::from_utf8_lossy(token).into_owned())
}

/// Reads the facts. os-release comes from `<root>/etc/os-release` (falling back to
/// `<root>/usr/lib/os-release`), read by [`read_root_file`] (a refused file counts as
/// missing); the kernel is the running kernel's (shared by every root on a machine);
/// the Kubernetes packages come from the dpkg database, the kubeadm and kubectl versions
/// from it or from the binaries, all without executing anything ([`binary_version`]),
/// through `cache`.
pub(crate) fn gather(root: &Path, node: &NodeContext, cache: &FactsCache) -> NodeFacts {
    let os_text = read_root_file(root, "etc/os-release")
        .or_else(|| read_root_file(root, "usr/lib/os-release"))
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_owned();
    let packages = cache.packages(root);
    NodeFacts {
        node_name: node.node_name.clone(),
        roles: node.roles.clone(),
        os: parse_os_release(&os_text),
        arch: go_arch().to_owned(),
        kernel,
        kubelet_version: node.kubelet_version.clone(),
        kubeadm_version: cache.version(root, packages.as_deref(), "kubeadm", KUBEADM),
        kubectl_version: cache.version(root, packages.as_deref(), "kubectl", KUBECTL),
        packages: packages.unwrap_or_default(),
    }
}

impl crate::Host {
    /// The node's facts exactly as a plugin's `facts.node` call sees them (os-release from
    /// the host root, architecture, running kernel, and the kubeadm version read from the
    /// dpkg database or the node's `/usr/bin/kubeadm` binary without executing it), plus
    /// the kubectl version (read the same way) and the installed Kubernetes packages. For
    /// the agent's own reports, so plugins, policies and status read a fact the same way.
    /// Nothing is executed, so `_timeout` (kept for callers) bounds nothing.
    pub fn node_facts(&self, node: &NodeContext, _timeout: Duration) -> NodeFacts {
        gather(&self.config().host_root, node, &self.facts_cache)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_go_version_is_the_twin_gitversion_or_else_the_build_info() {
        let scan = |bytes: &[u8]| scan_go_version(bytes).unwrap();
        // `-X` strings are NUL-terminated and aligned: a 9-byte one is padded to 16.
        assert_eq!(
            scan(b"junk\0v1.34.10\0\0\0\0\0\0\0\0v1.34.10\0tail"),
            Some("v1.34.10".into())
        );
        assert_eq!(
            scan(b"\0v1.35.0-rc.1\0v1.35.0-rc.1\0"),
            Some("v1.35.0-rc.1".into())
        );
        // A lone literal, two different versions, or no NUL before: not a version fact.
        assert_eq!(scan(b"\0v1.33.0\0"), None);
        assert_eq!(scan(b"\0v1.33.0\0v1.34.0\0"), None);
        assert_eq!(scan(b"xv1.33.0\0v1.33.0\0"), None);
        assert_eq!(scan(b"\0v1.33\0v1.33\0"), None);
        // Go build information (what `-trimpath` builds keep): the k8s.io/kubernetes module.
        let info = b"path\tk8s.io/kubernetes/cmd/kubeadm\nmod\tbosun.dev/lab\t(devel)\t\ndep\tk8s.io/kubernetes\tv1.34.4\th1:x=\n";
        assert_eq!(scan(info), Some("v1.34.4".into()));
        // The twin wins over the build information, wherever each is.
        let mut both = info.to_vec();
        both.extend_from_slice(b"\0v1.34.5\0v1.34.5\0");
        assert_eq!(scan(&both), Some("v1.34.5".into()));
        // Across the 1 MiB chunk boundary.
        let mut big = vec![b'x'; (1 << 20) - 5];
        big.extend_from_slice(b"\0v1.34.4\0v1.34.4\0");
        big.extend(vec![b'y'; 3 << 20]);
        assert_eq!(scan(&big), Some("v1.34.4".into()));
    }

    #[test]
    fn the_installed_kubernetes_packages_are_read_from_the_dpkg_database() {
        let status = "Package: kubeadm\nStatus: deinstall ok config-files\nVersion: 1.30.0-1.1\n\n\
                      Package: kubectl\nStatus: install ok installed\nVersion: 1.34.1-1.1\n\n\
                      Package: curl\nStatus: install ok installed\nVersion: 8.14.1-2\n\n\
                      Package: kubernetes-cni\nStatus: hold ok installed\nVersion: 1.7.1-1.1\n\n\
                      Package: kubeadm\nStatus: install ok installed\nArchitecture: amd64\nVersion: 1.34.4-1.1\n";
        let got = dpkg_installed(status, &KUBERNETES_PACKAGES);
        let pairs: Vec<(&str, &str)> = got
            .iter()
            .map(|p| (p.name.as_str(), p.version.as_str()))
            .collect();
        // In KUBERNETES_PACKAGES' order; the removed kubeadm and curl are not listed, a
        // missing kubelet is not made up.
        assert_eq!(
            pairs,
            [
                ("kubeadm", "1.34.4-1.1"),
                ("kubectl", "1.34.1-1.1"),
                ("kubernetes-cni", "1.7.1-1.1")
            ]
        );
        assert!(dpkg_installed("", &KUBERNETES_PACKAGES).is_empty());
    }

    #[test]
    fn kubeadm_and_kubectl_versions_come_from_dpkg_else_from_the_binaries() {
        let root = root_with_fallback();
        let cache = FactsCache::default();
        let facts = |cache: &FactsCache| gather(root.path(), &NodeContext::default(), cache);
        // Nothing installed: nothing reported.
        let f = facts(&cache);
        assert_eq!((f.kubeadm_version, f.kubectl_version), (None, None));
        assert!(f.packages.is_empty());
        // Binaries only (an rpm node, or binaries put there by hand).
        std::fs::create_dir_all(root.path().join("usr/bin")).unwrap();
        std::fs::write(root.path().join(KUBECTL), b"\0v1.34.2\0v1.34.2\0").unwrap();
        let f = facts(&cache);
        assert_eq!(f.kubectl_version.as_deref(), Some("v1.34.2"));
        assert_eq!(f.kubeadm_version, None);
        assert!(f.packages.is_empty());
        // A dpkg database: its packages are listed and win over the binaries.
        std::fs::create_dir_all(root.path().join("var/lib/dpkg")).unwrap();
        std::fs::write(
            root.path().join(DPKG_STATUS),
            "Package: kubectl\nStatus: install ok installed\nVersion: 1.34.4-1.1\n\n\
             Package: kubelet\nStatus: install ok installed\nVersion: 1.34.3-1.1\n",
        )
        .unwrap();
        let f = facts(&cache);
        assert_eq!(f.kubectl_version.as_deref(), Some("v1.34.4"));
        assert_eq!(f.kubeadm_version, None);
        assert_eq!(
            f.packages,
            [
                PackageVersion {
                    name: "kubelet".into(),
                    version: "1.34.3-1.1".into()
                },
                PackageVersion {
                    name: "kubectl".into(),
                    version: "1.34.4-1.1".into()
                },
            ]
        );
        // A changed database is read again (the cache keys on the file's identity).
        std::fs::write(
            root.path().join(DPKG_STATUS),
            "Package: kubectl\nStatus: install ok installed\nVersion: 1.35.0-1.1\n",
        )
        .unwrap();
        let f = facts(&cache);
        assert_eq!(f.kubectl_version.as_deref(), Some("v1.35.0"));
        assert_eq!(f.packages.len(), 1);
        // A database that is not a regular file is refused: no packages, the binary speaks.
        std::fs::remove_file(root.path().join(DPKG_STATUS)).unwrap();
        std::fs::create_dir(root.path().join(DPKG_STATUS)).unwrap();
        let f = facts(&cache);
        assert!(f.packages.is_empty());
        assert_eq!(f.kubectl_version.as_deref(), Some("v1.34.2"));
    }

    #[test]
    fn nothing_under_the_root_is_executed_for_facts() {
        use std::os::unix::fs::PermissionsExt;
        let root = root_with_fallback();
        std::fs::create_dir_all(root.path().join("usr/bin")).unwrap();
        let marker = root.path().join("ran");
        let script = format!("#!/bin/sh\necho ran > {}\necho v9.9.9\n", marker.display());
        let kubeadm = root.path().join("usr/bin/kubeadm");
        std::fs::write(&kubeadm, script).unwrap();
        std::fs::set_permissions(&kubeadm, std::fs::Permissions::from_mode(0o755)).unwrap();
        let cache = FactsCache::default();
        for _ in 0..3 {
            assert_eq!(
                gather(root.path(), &NodeContext::default(), &cache).kubeadm_version,
                None
            );
        }
        assert!(!marker.exists(), "kubeadm was executed");
        // A changed binary is read again, an unchanged one comes from the cache.
        std::fs::write(&kubeadm, b"\0v1.34.4\0v1.34.4\0").unwrap();
        assert_eq!(
            gather(root.path(), &NodeContext::default(), &cache)
                .kubeadm_version
                .as_deref(),
            Some("v1.34.4")
        );
    }

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
        let read = |root: &Path| gather(root, &NodeContext::default(), &FactsCache::default()).os;
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
        gather(root, &NodeContext::default(), &FactsCache::default())
            .os
            .id
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
        let up = format!(
            "{}{}",
            "../".repeat(rel.path().components().count() + 1),
            secret.display()
        );
        std::os::unix::fs::symlink(&up, rel.path().join("etc/os-release")).unwrap();
        assert!(
            rel.path().join("etc/os-release").is_file(),
            "the relative link does reach {}",
            secret.display()
        );
        assert_eq!(os_id(rel.path()), "fallback");
        // Both links followed the plain way would have read the outside file.
        assert_eq!(
            std::fs::read_to_string(abs.path().join("etc/os-release")).unwrap(),
            "ID=outside\n"
        );
    }

    #[test]
    fn os_release_that_is_not_a_regular_file_is_refused_without_blocking() {
        // A FIFO nobody writes to: a blocking open or read would never return.
        let fifo = root_with_fallback();
        let status = std::process::Command::new("mkfifo")
            .arg(fifo.path().join("etc/fifo"))
            .status()
            .unwrap();
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
        use std::os::unix::fs::FileTypeExt as _;
        // A character device needs CAP_MKNOD (root): without it this test fails rather
        // than passes without checking anything.
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &zero,
            rustix::fs::FileType::CharacterDevice,
            rustix::fs::Mode::from_raw_mode(0o666),
            rustix::fs::makedev(1, 5),
        )
        .unwrap_or_else(|e| {
            panic!(
                "mknod {} c 1 5: {e}; this test needs CAP_MKNOD: run the host's tests as root",
                zero.display()
            )
        });
        assert!(
            std::fs::metadata(&zero)
                .unwrap()
                .file_type()
                .is_char_device(),
            "{} is not a character device",
            zero.display()
        );
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
        std::fs::write(
            root.path().join("usr/lib/os-release"),
            "ID=debian\nVERSION_ID=\"12\"\n",
        )
        .unwrap();
        std::os::unix::fs::symlink("../usr/lib/os-release", root.path().join("etc/os-release"))
            .unwrap();
        let os = gather(root.path(), &NodeContext::default(), &FactsCache::default()).os;
        assert_eq!((os.id.as_str(), os.version_id.as_str()), ("debian", "12"));
    }
}
