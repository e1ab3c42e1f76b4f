//! Filesystem grants: resolving each granted directory under the host root into a WASI
//! preopen, refusing any grant that would reach outside the root or weaken another.
//!
//! Inside a preopen, wasmtime-wasi (cap-std) confines every path: `..` past the
//! preopen, absolute paths and symlinks leading out are refused, and a read-only preopen
//! refuses creating, truncating, renaming, linking and removing (see the host's tests).

use std::path::{Path, PathBuf};

use bosun_api::grants::{Access, FilesystemGrant};
use cap_std::ambient_authority;
use cap_std::fs::Dir;
use wasmtime_wasi::FsPerms;

use crate::error::Error;
use crate::exec::normalized_absolute;

/// One directory to preopen: where it is on the host, the path the guest sees, and
/// what the guest may do in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Preopen {
    pub host: PathBuf,
    pub guest: String,
    pub perms: FsPerms,
}

fn invalid(grant: &FilesystemGrant, reason: impl Into<String>) -> Error {
    Error::InvalidGrant { grant: format!("filesystem {} ({:?})", grant.path, grant.access), reason: reason.into() }
}

fn is_under(inner: &str, outer: &str) -> bool {
    outer == "/" || inner == outer || inner.strip_prefix(outer).is_some_and(|rest| rest.starts_with('/'))
}

/// Resolves `grants` under `root`. The directory must exist. Every symlink on the way
/// is followed only inside the root (cap-std), and the final canonical path is checked
/// to be under the canonical root. A read-only grant inside a read-write one is refused:
/// the guest could reach it through the writable preopen and write there anyway.
pub(crate) fn resolve(root: &Path, grants: &[FilesystemGrant]) -> Result<Vec<Preopen>, Error> {
    if grants.is_empty() {
        return Ok(Vec::new());
    }
    let root = root
        .canonicalize()
        .map_err(|e| Error::setup(format!("host root {}: {e}", root.display())))?;
    let root_dir = Dir::open_ambient_dir(&root, ambient_authority())
        .map_err(|e| Error::setup(format!("host root {}: {e}", root.display())))?;
    let mut out: Vec<Preopen> = Vec::new();
    for grant in grants {
        normalized_absolute(&grant.path).map_err(|e| invalid(grant, e))?;
        for other in grants {
            if other.access == Access::ReadWrite
                && grant.access == Access::ReadOnly
                && is_under(&grant.path, &other.path)
            {
                return Err(invalid(
                    grant,
                    format!(
                        "it lies inside the read-write grant {}, through which it would be writable; \
                         grant the read-write directory more narrowly",
                        other.path
                    ),
                ));
            }
        }
        let rel = grant.path.trim_start_matches('/');
        let host = if rel.is_empty() {
            root.clone()
        } else {
            // cap-std resolves every component inside the root: a symlink on the way that
            // points outside makes this fail instead of leaving the root.
            root_dir.open_dir(rel).map_err(|e| {
                invalid(grant, format!("no such directory inside the host root {} ({e})", root.display()))
            })?;
            let canonical = root
                .join(rel)
                .canonicalize()
                .map_err(|e| invalid(grant, format!("{}: {e}", root.join(rel).display())))?;
            if !canonical.starts_with(&root) {
                return Err(invalid(grant, format!("resolves to {} outside the host root", canonical.display())));
            }
            canonical
        };
        let perms = match grant.access {
            Access::ReadOnly => FsPerms::ReadOnly,
            Access::ReadWrite => FsPerms::ReadWrite,
        };
        if let Some(dup) = out.iter().find(|p| p.guest == grant.path) {
            if dup.perms != perms {
                return Err(invalid(grant, "the same path is granted twice with different access"));
            }
            continue;
        }
        out.push(Preopen { host, guest: grant.path.clone(), perms });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(path: &str, access: Access) -> FilesystemGrant {
        FilesystemGrant { path: path.into(), access }
    }

    #[test]
    fn grants_resolve_under_the_root() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("etc/kubernetes")).unwrap();
        let p = resolve(root.path(), &[g("/etc/kubernetes", Access::ReadOnly)]).unwrap();
        assert_eq!(p[0].host, root.path().canonicalize().unwrap().join("etc/kubernetes"));
        assert_eq!(p[0].guest, "/etc/kubernetes");
        assert_eq!(p[0].perms, FsPerms::ReadOnly);
    }

    #[test]
    fn dotdot_and_relative_grants_are_refused() {
        let root = tempfile::tempdir().unwrap();
        for bad in ["/etc/../..", "etc", "/etc/./x", "/a//b"] {
            assert!(matches!(resolve(root.path(), &[g(bad, Access::ReadOnly)]), Err(Error::InvalidGrant { .. })), "{bad}");
        }
    }

    #[test]
    fn a_grant_through_a_symlink_leading_outside_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("escape")).unwrap();
        std::os::unix::fs::symlink("../../../../../../..", root.path().join("up")).unwrap();
        for bad in ["/escape", "/up/etc"] {
            let e = resolve(root.path(), &[g(bad, Access::ReadOnly)]).unwrap_err();
            assert!(matches!(e, Error::InvalidGrant { .. }), "{bad}: {e}");
        }
    }

    #[test]
    fn read_only_inside_read_write_is_refused() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("var/lib/secret")).unwrap();
        let e = resolve(root.path(), &[g("/var", Access::ReadWrite), g("/var/lib/secret", Access::ReadOnly)]).unwrap_err();
        assert!(e.to_string().contains("inside the read-write grant /var"), "{e}");
        // Siblings and read-write inside read-only are fine.
        std::fs::create_dir_all(root.path().join("varx")).unwrap();
        resolve(root.path(), &[g("/var", Access::ReadWrite), g("/varx", Access::ReadOnly)]).unwrap();
        resolve(root.path(), &[g("/var", Access::ReadOnly), g("/var/lib", Access::ReadWrite)]).unwrap();
    }
}
