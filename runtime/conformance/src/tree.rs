//! A snapshot of a whole node root, to tell whether a call changed anything in it.
//!
//! Every entry is recorded by its path: its type, permission bits, owner and group, and
//! for a regular file the sha256 of its content, for a symlink its target, for a device its
//! number. Modification and access times are left out: reading a file must not count as a
//! change, and rewriting a file with the same bytes is not one either. Symlinks are never
//! followed.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::Path;

use anyhow::{Context as _, Result};
use sha2::{Digest as _, Sha256};

/// Path (absolute as the node sees it, `/etc/os-release`) to a summary of the entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot(BTreeMap<String, String>);

impl Snapshot {
    /// Reads the tree at `root`, leaving out the paths in `ignore` (node paths such as
    /// `/var/log`, each with everything beneath it).
    pub fn of(root: &Path, ignore: &[String]) -> Result<Snapshot> {
        let mut entries = BTreeMap::new();
        walk(root, "", ignore, &mut entries)?;
        Ok(Snapshot(entries))
    }

    /// How many entries the snapshot holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when the snapshot holds nothing (not even the root).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The paths added, removed or changed between `self` and `after`, in path order.
    pub fn changes(&self, after: &Snapshot) -> Vec<Change> {
        let mut out = Vec::new();
        for (path, was) in &self.0 {
            match after.0.get(path) {
                None => out.push(Change::Removed(path.clone())),
                Some(now) if now != was => out.push(Change::Changed(path.clone())),
                Some(_) => {}
            }
        }
        for path in after.0.keys() {
            if !self.0.contains_key(path) {
                out.push(Change::Added(path.clone()));
            }
        }
        out.sort_by(|a, b| a.path().cmp(b.path()));
        out
    }
}

/// One difference between two snapshots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Added(String),
    Removed(String),
    Changed(String),
}

impl Change {
    /// The node path that changed.
    pub fn path(&self) -> &str {
        match self {
            Change::Added(p) | Change::Removed(p) | Change::Changed(p) => p,
        }
    }
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Change::Added(p) => write!(f, "added {p}"),
            Change::Removed(p) => write!(f, "removed {p}"),
            Change::Changed(p) => write!(f, "changed {p}"),
        }
    }
}

/// True when `path` is `prefix` or beneath it.
pub(crate) fn beneath(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    prefix.is_empty()
        || path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

fn walk(
    root: &Path,
    node_path: &str,
    ignore: &[String],
    out: &mut BTreeMap<String, String>,
) -> Result<()> {
    let shown = if node_path.is_empty() { "/" } else { node_path };
    if !node_path.is_empty() && ignore.iter().any(|i| beneath(node_path, i)) {
        return Ok(());
    }
    let host_path = root.join(node_path.trim_start_matches('/'));
    let meta = std::fs::symlink_metadata(&host_path)
        .with_context(|| format!("reading {}", host_path.display()))?;
    let owner = format!("{:o} {}:{}", meta.mode() & 0o7777, meta.uid(), meta.gid());
    let t = meta.file_type();
    let summary = if t.is_dir() {
        format!("dir {owner}")
    } else if t.is_file() {
        format!("file {owner} {}", file_digest(&host_path)?)
    } else if t.is_symlink() {
        let target = std::fs::read_link(&host_path)
            .with_context(|| format!("reading the link {}", host_path.display()))?;
        format!("link {owner} -> {}", target.display())
    } else if t.is_char_device() || t.is_block_device() {
        format!("device {owner} {}", meta.rdev())
    } else {
        format!("special {owner}")
    };
    out.insert(shown.to_owned(), summary);
    if t.is_dir() {
        let mut names: Vec<_> = std::fs::read_dir(&host_path)
            .with_context(|| format!("listing {}", host_path.display()))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .with_context(|| format!("listing {}", host_path.display()))?;
        names.sort();
        for name in names {
            let child = format!("{node_path}/{}", name.to_string_lossy());
            walk(root, &child, ignore, out)?;
        }
    }
    Ok(())
}

fn file_digest(path: &Path) -> Result<String> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_mode_links_and_new_files_are_changes_and_ignored_paths_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::create_dir_all(root.join("var/log")).unwrap();
        std::fs::write(root.join("etc/a.conf"), "one").unwrap();
        std::os::unix::fs::symlink("a.conf", root.join("etc/link")).unwrap();
        let ignore = vec!["/var/log".to_owned()];
        let before = Snapshot::of(root, &ignore).unwrap();
        assert_eq!(before.len(), 5, "{before:?}");

        // Reading, and writing the same bytes again, change nothing.
        std::fs::read(root.join("etc/a.conf")).unwrap();
        std::fs::write(root.join("etc/a.conf"), "one").unwrap();
        std::fs::write(root.join("var/log/tool.log"), "ran").unwrap();
        assert_eq!(Snapshot::of(root, &ignore).unwrap(), before);

        std::fs::write(root.join("etc/a.conf"), "two").unwrap();
        std::fs::remove_file(root.join("etc/link")).unwrap();
        std::os::unix::fs::symlink("b.conf", root.join("etc/link")).unwrap();
        std::fs::write(root.join("etc/new"), "").unwrap();
        let after = Snapshot::of(root, &ignore).unwrap();
        let changes: Vec<String> = before
            .changes(&after)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            changes,
            ["changed /etc/a.conf", "changed /etc/link", "added /etc/new"]
        );

        use std::os::unix::fs::PermissionsExt as _;
        let now = after.clone();
        std::fs::set_permissions(root.join("etc/new"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        std::fs::remove_file(root.join("etc/a.conf")).unwrap();
        let last = Snapshot::of(root, &ignore).unwrap();
        let changes: Vec<String> = now.changes(&last).iter().map(ToString::to_string).collect();
        assert_eq!(changes, ["removed /etc/a.conf", "changed /etc/new"]);
    }

    #[test]
    fn beneath_means_the_path_or_below_it() {
        assert!(beneath("/var/log", "/var/log"));
        assert!(beneath("/var/log/apt/x", "/var/log/"));
        assert!(!beneath("/var/logs", "/var/log"));
        assert!(beneath("/anything", "/"));
    }
}
