//! Filesystem grants: resolving each granted directory under the host root into a WASI
//! preopen, refusing any grant that would reach outside the root or weaken another.
//!
//! A granted path must name a real directory: no component below the host root may be a
//! symlink (the host root itself may be reached through symlinks; it is canonicalized
//! first). So the directory preopened is exactly `host_root` + the written path, and the
//! overlap checks (a read-only grant inside a read-write one) compare what is really
//! opened. Without that rule, on a merged-/usr root (`/lib -> usr/lib`) the grants
//! `/usr/lib` read-write and `/lib/modules` read-only would pass a comparison of the
//! written paths while the read-only one lies inside the writable one; and a plugin with
//! write access could replace a granted subdirectory by a symlink (`../../../etc`) that a
//! later run would preopen.
//!
//! Residual race: the check and the preopen are two steps. `resolve` inspects the path,
//! then wasmtime-wasi opens the directory again by name. A process running concurrently
//! with write access to a parent of a granted directory (for example something a granted
//! command left running) could swap a component for a symlink in between. Closing that
//! needs wasmtime-wasi to accept an already opened directory; until then a grant is only
//! as safe as the write access others have to its parents.
//!
//! Inside a preopen, wasmtime-wasi (cap-std) confines every path: `..` past the
//! preopen, absolute paths and symlinks leading out are refused, and a read-only preopen
//! refuses creating, truncating, renaming, linking and removing (see the host's tests).

use std::io::ErrorKind;
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
    Error::InvalidGrant {
        grant: format!("filesystem {} ({:?})", grant.path, grant.access),
        reason: reason.into(),
    }
}

/// Resolves `grants` under `root`. Every granted directory must exist and be reached
/// without any symlink below the canonical root (see the module docs), so each preopen's
/// host path is exactly the canonical root joined with the granted path. The overlap
/// checks run on those resolved paths: a read-only grant inside a read-write one is
/// refused (the guest could reach it through the writable preopen and write there anyway),
/// and so is the same directory granted twice with different access.
pub(crate) fn resolve(root: &Path, grants: &[FilesystemGrant]) -> Result<Vec<Preopen>, Error> {
    if grants.is_empty() {
        return Ok(Vec::new());
    }
    let root = root
        .canonicalize()
        .map_err(|e| Error::setup(format!("host root {}: {e}", root.display())))?;
    let root_dir = Dir::open_ambient_dir(&root, ambient_authority())
        .map_err(|e| Error::setup(format!("host root {}: {e}", root.display())))?;
    let mut resolved: Vec<(&FilesystemGrant, Preopen)> = Vec::with_capacity(grants.len());
    for grant in grants {
        normalized_absolute(&grant.path).map_err(|e| invalid(grant, e))?;
        // A missing optional directory is simply not preopened: the guest sees no such path.
        let Some(host) = resolve_one(&root, &root_dir, grant)? else {
            continue;
        };
        let perms = match grant.access {
            Access::ReadOnly => FsPerms::ReadOnly,
            Access::ReadWrite => FsPerms::ReadWrite,
        };
        resolved.push((
            grant,
            Preopen {
                host,
                guest: grant.path.clone(),
                perms,
            },
        ));
    }
    for (grant, p) in &resolved {
        for (other, q) in &resolved {
            if p.perms == FsPerms::ReadOnly
                && q.perms == FsPerms::ReadWrite
                && p.host.starts_with(&q.host)
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
    }
    let mut out: Vec<Preopen> = Vec::with_capacity(resolved.len());
    for (grant, p) in resolved {
        if let Some(dup) = out.iter().find(|d| d.host == p.host) {
            // One host directory has one guest path: resolved paths equal written ones.
            debug_assert_eq!(dup.guest, p.guest);
            if dup.perms != p.perms {
                return Err(invalid(
                    grant,
                    "the same path is granted twice with different access",
                ));
            }
            continue;
        }
        out.push(p);
    }
    Ok(out)
}

/// The host path of one grant: `root` joined with the granted path, after checking,
/// component by component and without following anything, that each component is a
/// directory and not a symlink. `root` is canonical and `root_dir` is it opened.
/// `None` when the grant is optional and a component of the path does not exist.
fn resolve_one(
    root: &Path,
    root_dir: &Dir,
    grant: &FilesystemGrant,
) -> Result<Option<PathBuf>, Error> {
    let rel = Path::new(grant.path.trim_start_matches('/'));
    if rel.as_os_str().is_empty() {
        return Ok(Some(root.to_path_buf()));
    }
    let mut prefix = PathBuf::new();
    for component in rel.components() {
        prefix.push(component);
        // Every earlier component was checked to be a real directory, so this lstat sees
        // exactly `root/prefix`; cap-std keeps it inside the root regardless.
        let meta = match root_dir.symlink_metadata(&prefix) {
            Err(e) if e.kind() == ErrorKind::NotFound && grant.optional => return Ok(None),
            other => other,
        };
        let meta = meta.map_err(|e| {
            if e.kind() == ErrorKind::NotFound {
                invalid(
                    grant,
                    format!(
                        "/{} does not exist under the host root {}; create it, or mark the grant `optional: true` \
                         if the directory is missing on some nodes by design",
                        prefix.display(),
                        root.display()
                    ),
                )
            } else {
                invalid(grant, format!("/{} under the host root {}: {e}", prefix.display(), root.display()))
            }
        })?;
        if meta.file_type().is_symlink() {
            let target = root_dir.read_link_contents(&prefix).map_or_else(
                |e| format!("(unreadable: {e})"),
                |t| t.display().to_string(),
            );
            // cap-std resolves inside the root only: an absolute target or one climbing
            // out of the root has no real path to offer.
            let instead = match root_dir.canonicalize(rel) {
                Ok(real) if root_dir.metadata(&real).is_ok_and(|m| m.is_dir()) => {
                    format!("grant the real path /{} instead", real.display())
                }
                _ => "it does not lead to a directory inside the host root; grant a real directory instead"
                    .to_owned(),
            };
            return Err(invalid(
                grant,
                format!(
                    "the path goes through the symlink /{} -> {target}; {instead}",
                    prefix.display()
                ),
            ));
        }
        if !meta.is_dir() {
            return Err(invalid(
                grant,
                format!("/{} is not a directory", prefix.display()),
            ));
        }
    }
    // The rule the checks above establish, stated once more on the whole path: what is
    // opened is exactly what was written (this also catches a component swapped for a
    // symlink while the loop ran).
    let host = root.join(rel);
    let canonical = host
        .canonicalize()
        .map_err(|e| invalid(grant, format!("{}: {e}", host.display())))?;
    if canonical != host {
        return Err(invalid(
            grant,
            format!(
                "{} resolves to {}: a component changed into a symlink while the grant was checked",
                host.display(),
                canonical.display()
            ),
        ));
    }
    Ok(Some(host))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(path: &str, access: Access) -> FilesystemGrant {
        FilesystemGrant {
            path: path.into(),
            access,
            optional: false,
        }
    }

    #[test]
    fn grants_resolve_under_the_root() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("etc/kubernetes")).unwrap();
        let p = resolve(root.path(), &[g("/etc/kubernetes", Access::ReadOnly)]).unwrap();
        assert_eq!(
            p[0].host,
            root.path().canonicalize().unwrap().join("etc/kubernetes")
        );
        assert_eq!(p[0].guest, "/etc/kubernetes");
        assert_eq!(p[0].perms, FsPerms::ReadOnly);
    }

    #[test]
    fn dotdot_and_relative_grants_are_refused() {
        let root = tempfile::tempdir().unwrap();
        for bad in ["/etc/../..", "etc", "/etc/./x", "/a//b"] {
            assert!(
                matches!(
                    resolve(root.path(), &[g(bad, Access::ReadOnly)]),
                    Err(Error::InvalidGrant { .. })
                ),
                "{bad}"
            );
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
        let e = resolve(
            root.path(),
            &[
                g("/var", Access::ReadWrite),
                g("/var/lib/secret", Access::ReadOnly),
            ],
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("inside the read-write grant /var"),
            "{e}"
        );
        // Siblings and read-write inside read-only are fine.
        std::fs::create_dir_all(root.path().join("varx")).unwrap();
        resolve(
            root.path(),
            &[g("/var", Access::ReadWrite), g("/varx", Access::ReadOnly)],
        )
        .unwrap();
        resolve(
            root.path(),
            &[
                g("/var", Access::ReadOnly),
                g("/var/lib", Access::ReadWrite),
            ],
        )
        .unwrap();
    }

    #[test]
    fn a_missing_optional_grant_is_left_out_and_a_missing_required_one_refused() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("etc/kubernetes")).unwrap();
        let optional = |path: &str| FilesystemGrant {
            optional: true,
            ..g(path, Access::ReadOnly)
        };
        let p = resolve(
            root.path(),
            &[
                g("/etc/kubernetes", Access::ReadOnly),
                optional("/etc/kubernetes/manifests"),
            ],
        )
        .unwrap();
        assert_eq!(
            p.iter().map(|p| p.guest.as_str()).collect::<Vec<_>>(),
            ["/etc/kubernetes"]
        );
        // Present: preopened like any other grant.
        std::fs::create_dir_all(root.path().join("etc/kubernetes/manifests")).unwrap();
        let p = resolve(root.path(), &[optional("/etc/kubernetes/manifests")]).unwrap();
        assert_eq!(
            p[0].host,
            root.path()
                .canonicalize()
                .unwrap()
                .join("etc/kubernetes/manifests")
        );
        // Required and missing: refused, saying how to mark it optional.
        let e = resolve(root.path(), &[g("/etc/missing", Access::ReadOnly)]).unwrap_err();
        assert!(
            e.to_string().contains("does not exist") && e.to_string().contains("optional: true"),
            "{e}"
        );
        // Optional does not excuse a symlink: it is not a missing directory.
        std::os::unix::fs::symlink("etc", root.path().join("link")).unwrap();
        assert!(matches!(
            resolve(root.path(), &[optional("/link/kubernetes")]),
            Err(Error::InvalidGrant { .. })
        ));
    }
}
