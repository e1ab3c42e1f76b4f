//! Reading and writing files on the node through the plugin's filesystem grants.
//!
//! Granted directories are preopened by the host at their node paths, so `std::fs` works
//! as usual on absolute paths inside them. These helpers add what `std::fs` errors lack:
//! the path, and which grant is needed when access fails, and they convert into a
//! [`PluginError`] with `?`.

use std::io;
use std::path::{Path, PathBuf};

use crate::PluginError;

/// A file operation that failed, with the path and a hint about the grant it needs.
#[derive(Debug, thiserror::Error)]
#[error("{op} `{path}`: {source}{hint}", path = path.display(), hint = self.hint())]
pub struct FsError {
    /// What was attempted: `reading`, `writing`, `checking`.
    pub op: &'static str,
    /// The path as the plugin passed it.
    pub path: PathBuf,
    /// The underlying error.
    pub source: io::Error,
}

impl FsError {
    fn needs_write(&self) -> bool {
        self.op == "writing"
    }

    fn hint(&self) -> String {
        let dir = self.path.parent().unwrap_or(&self.path).display();
        match self.source.kind() {
            io::ErrorKind::NotFound => format!(
                " (if it exists on the node, the plugin needs a filesystem grant covering it, \
                 for example `{{path: {dir}, access: {}}}`)",
                if self.needs_write() {
                    "ReadWrite"
                } else {
                    "ReadOnly"
                }
            ),
            io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem
                if self.needs_write() =>
            {
                format!(" (writing needs a ReadWrite filesystem grant covering `{dir}`)")
            }
            // A path with no grant reads as not found; "not permitted" on a granted path is
            // a symlink leading out of the grant, or a file that is not regular (the host
            // opens neither). The step's message says which, from the host's refusal.
            io::ErrorKind::PermissionDenied => format!(
                " (a symlink leading out of the plugin's grants, or not a regular file: the host follows no \
                 symlink out of a grant and opens only regular files; read the real path, through a grant covering \
                 it, or grant `{dir}` if it has none)"
            ),
            _ => String::new(),
        }
    }

    /// The `plugin-error` code for this failure.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self.source.kind() {
            io::ErrorKind::NotFound => "file-not-found",
            io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
                "file-access-denied"
            }
            _ => "file-error",
        }
    }
}

impl From<FsError> for PluginError {
    fn from(e: FsError) -> Self {
        PluginError::new(e.code(), e.to_string())
    }
}

fn err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FsError + 'a {
    move |source| FsError {
        op,
        path: path.to_owned(),
        source,
    }
}

/// Reads a whole file as UTF-8 text.
///
/// # Errors
/// [`FsError`] naming the path and the grant needed.
pub fn read_to_string(path: impl AsRef<Path>) -> Result<String, FsError> {
    let path = path.as_ref();
    std::fs::read_to_string(path).map_err(err("reading", path))
}

/// Reads a whole file as bytes.
///
/// # Errors
/// [`FsError`] naming the path and the grant needed.
pub fn read(path: impl AsRef<Path>) -> Result<Vec<u8>, FsError> {
    let path = path.as_ref();
    std::fs::read(path).map_err(err("reading", path))
}

/// Reads a file if it exists: `Ok(None)` when it does not (useful to check whether an
/// earlier run already did the work).
///
/// # Errors
/// [`FsError`] for every failure other than "not found".
pub fn read_optional(path: impl AsRef<Path>) -> Result<Option<String>, FsError> {
    let path = path.as_ref();
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(err("reading", path)(e)),
    }
}

/// Writes `contents` to a file, replacing it: written to a temporary file next to it and
/// renamed over it, so readers never see a half-written file.
///
/// # Errors
/// [`FsError`] naming the path and the ReadWrite grant needed.
pub fn write(path: impl AsRef<Path>, contents: impl AsRef<[u8]>) -> Result<(), FsError> {
    let path = path.as_ref();
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".bosun-tmp");
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, contents).map_err(err("writing", path))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        err("writing", path)(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_file_names_path_and_grant() {
        let e = read_to_string("/nonexistent-bosun-dir/os-release").unwrap_err();
        let pe = PluginError::from(e);
        assert_eq!(pe.code, "file-not-found");
        assert!(
            pe.message
                .contains("reading `/nonexistent-bosun-dir/os-release`"),
            "{}",
            pe.message
        );
        assert!(
            pe.message
                .contains("path: /nonexistent-bosun-dir, access: ReadOnly"),
            "{}",
            pe.message
        );
    }

    #[test]
    fn optional_read_and_atomic_write_round_trip() {
        let dir = std::env::temp_dir().join(format!("bosun-sdk-fs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("state");
        assert_eq!(read_optional(&f).unwrap(), None);
        write(&f, "one").unwrap();
        write(&f, "two").unwrap();
        assert_eq!(read_optional(&f).unwrap().as_deref(), Some("two"));
        assert!(!dir.join("state.bosun-tmp").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
