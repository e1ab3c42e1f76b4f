//! Trust roots: the public keys a cluster administrator trusts to sign plugins.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use crate::TrustError;
use crate::keys::{KeyId, PublicKey, public_keys_from_pem};

/// One trusted public key and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustRoot {
    /// The key.
    pub key: PublicKey,
    /// The key's id.
    pub key_id: KeyId,
    /// Where it was loaded from (a file path, or a label given by the caller).
    pub origin: String,
}

/// A set of trusted public keys, unique by key id, kept in key-id order so that
/// verification tries them in a stable order.
///
/// The empty set trusts nothing: verification against it fails with
/// [`TrustError::NoTrustRoots`].
#[derive(Clone, Debug, Default)]
pub struct TrustRoots {
    roots: BTreeMap<KeyId, TrustRoot>,
}

impl TrustRoots {
    /// An empty set.
    #[must_use]
    pub fn new() -> Self {
        TrustRoots::default()
    }

    /// Adds a key. Returns `false` if a key with the same id was already present (the
    /// first origin is kept).
    pub fn add(&mut self, key: PublicKey, origin: impl Into<String>) -> bool {
        let key_id = key.key_id();
        if self.roots.contains_key(&key_id) {
            return false;
        }
        self.roots.insert(
            key_id,
            TrustRoot {
                key,
                key_id,
                origin: origin.into(),
            },
        );
        true
    }

    /// Adds every `PUBLIC KEY` block of a PEM text; returns how many keys were new.
    ///
    /// # Errors
    /// The first key that cannot be used (unsupported algorithm, weak, malformed, a
    /// private key, or no key at all); nothing is added then.
    pub fn add_pem(&mut self, pem: &str, origin: &str) -> Result<usize, TrustError> {
        let keys = public_keys_from_pem(pem, origin)?;
        Ok(keys
            .into_iter()
            .filter(|k| self.add(k.clone(), origin))
            .count())
    }

    /// Adds keys from a PEM file, or from every `*.pem` and `*.pub` file directly inside a
    /// directory (other files, and names starting with `.` such as the `..data` links of
    /// a mounted ConfigMap, are skipped). Files are read in name order. Returns how many
    /// keys were new.
    ///
    /// # Errors
    /// [`TrustError::Io`]; any file's key error; [`TrustError::NoKeysFound`] for a
    /// directory with no key files.
    pub fn add_path(&mut self, path: impl AsRef<Path>) -> Result<usize, TrustError> {
        let path = path.as_ref();
        let meta = fs::metadata(path).map_err(|e| TrustError::io("reading", path, e))?;
        if !meta.is_dir() {
            let text = fs::read_to_string(path).map_err(|e| TrustError::io("reading", path, e))?;
            return self.add_pem(&text, &path.display().to_string());
        }
        let mut files = Vec::new();
        let entries =
            fs::read_dir(path).map_err(|e| TrustError::io("listing directory", path, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| TrustError::io("listing directory", path, e))?;
            let file_name = entry.file_name();
            let name = file_name.to_string_lossy();
            if name.starts_with('.') || !(name.ends_with(".pem") || name.ends_with(".pub")) {
                continue;
            }
            let file = entry.path();
            // Follows symlinks: mounted ConfigMaps and Secrets are symlinks to files.
            let is_file = fs::metadata(&file)
                .map_err(|e| TrustError::io("reading", &file, e))?
                .is_file();
            if is_file {
                files.push(file);
            }
        }
        if files.is_empty() {
            return Err(TrustError::NoKeysFound {
                origin: format!("{} (no *.pem or *.pub files)", path.display()),
                expected: "PUBLIC KEY",
            });
        }
        files.sort();
        let mut added = 0;
        for file in files {
            added += self.add_path(&file)?;
        }
        Ok(added)
    }

    /// Loads a set from files and directories (see [`TrustRoots::add_path`]).
    ///
    /// # Errors
    /// As [`TrustRoots::add_path`].
    pub fn load<P: AsRef<Path>>(paths: impl IntoIterator<Item = P>) -> Result<Self, TrustError> {
        let mut roots = TrustRoots::new();
        for path in paths {
            roots.add_path(path)?;
        }
        Ok(roots)
    }

    /// The root with this exact id.
    #[must_use]
    pub fn get(&self, key_id: &KeyId) -> Option<&TrustRoot> {
        self.roots.get(key_id)
    }

    /// All roots, in key-id order.
    pub fn iter(&self) -> impl Iterator<Item = &TrustRoot> {
        self.roots.values()
    }

    /// How many keys are trusted.
    #[must_use]
    pub fn len(&self) -> usize {
        self.roots.len()
    }

    /// Whether no key is trusted.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }
}
