//! The one error type of this crate. Every message says what was expected, what was
//! found, and what to do about it.

use std::fmt;
use std::io;
use std::path::PathBuf;

use crate::digest::Digest;
use crate::keys::{Algorithm, KeyId};

/// Everything that can go wrong while pinning, signing, loading keys or verifying.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrustError {
    /// A digest string is not `sha256:` followed by 64 hex digits.
    #[error(
        "malformed digest {input:?}: {reason}; expected `sha256:` followed by 64 hex digits \
         (as printed by `kubectl bosun plugin inspect` or `sha256sum`)"
    )]
    MalformedDigest { input: String, reason: String },

    /// The plugin's bytes do not hash to the pinned digest.
    #[error(
        "plugin bytes hash to {found}, but {expected} is pinned: the plugin changed after it was \
         pinned, or the pin is wrong; fetch the exact bytes that were signed, or pin and sign the \
         new bytes (`kubectl bosun plugin sign`)"
    )]
    DigestMismatch { expected: Digest, found: Digest },

    /// A plugin name is not a lowercase DNS label.
    #[error(
        "invalid plugin name {name:?}: {reason}; expected a lowercase DNS label \
         (a-z, 0-9 and '-', 1 to 63 characters, starting and ending with a letter or digit)"
    )]
    InvalidName { name: String, reason: String },

    /// A plugin version is not a semantic version.
    #[error(
        "invalid plugin version {version:?}: {reason}; expected a semantic version such as \
         1.2.3 or 1.2.3-rc.1 (no leading 'v')"
    )]
    InvalidVersion { version: String, reason: String },

    /// A signed statement file does not have the exact v1 layout.
    #[error(
        "malformed signature statement: {reason}; expected exactly the bytes printed by \
         `kubectl bosun plugin statement`"
    )]
    MalformedStatement { reason: String },

    /// The plugin carries no signature at all.
    #[error(
        "plugin {name} {version} has no signatures; sign it with `kubectl bosun plugin sign` \
         (or `cosign sign-blob` over `kubectl bosun plugin statement`) and list the signature \
         in the Plugin's spec.signatures"
    )]
    NoSignatures { name: String, version: String },

    /// Verification was asked for with an empty set of trust roots.
    #[error(
        "no trust roots are configured, so no plugin can be verified; add the signer's public \
         key (a PEM `PUBLIC KEY` file, Ed25519 or ECDSA P-256) to the trust roots"
    )]
    NoTrustRoots,

    /// One signature entry cannot even be decoded.
    #[error("signature #{index} ({algorithm}) is malformed: {reason}")]
    MalformedSignature {
        index: usize,
        algorithm: Algorithm,
        reason: String,
    },

    /// No signature verified against any trust root.
    #[error(
        "plugin {name} {version} ({digest}) is not signed by a trusted key: {attempts}; sign it \
         with `kubectl bosun plugin sign --key KEY` using a trusted key, or add the signer's \
         public key to the trust roots"
    )]
    Untrusted {
        name: String,
        version: String,
        digest: Digest,
        attempts: Attempts,
    },

    /// A signature algorithm name is not one this crate knows.
    #[error("unknown signature algorithm {0:?}; expected \"ed25519\" or \"ecdsa-p256-sha256\"")]
    UnknownAlgorithm(String),

    /// A key id string is not `sha256:` followed by hex.
    #[error(
        "malformed key id {input:?}: expected `sha256:` followed by 16 to 64 hex digits \
         (as printed by `kubectl bosun plugin keygen`)"
    )]
    MalformedKeyId { input: String },

    /// PEM text could not be decoded.
    #[error("{origin}: malformed PEM: {reason}")]
    MalformedPem { origin: String, reason: String },

    /// A public or private key is of an algorithm Bosun does not accept.
    #[error(
        "{origin}: unsupported key algorithm {algorithm}; Bosun accepts Ed25519 keys \
         (`openssl genpkey -algorithm ed25519`, `kubectl bosun plugin keygen`) and ECDSA P-256 keys \
         (`cosign generate-key-pair`)"
    )]
    UnsupportedKey { origin: String, algorithm: String },

    /// A private key was offered where only public keys belong.
    #[error(
        "{origin}: holds a private key (PEM {label:?}); trust roots hold public keys only: \
         use the matching `.pub` file (`openssl pkey -pubout` prints it)"
    )]
    PrivateKeyInTrustRoots { origin: String, label: String },

    /// An Ed25519 public key of small order, which would accept forged signatures.
    #[error(
        "{origin}: weak Ed25519 public key (a point of small order) refused: signatures under it \
         prove nothing; generate a real key with `kubectl bosun plugin keygen`"
    )]
    WeakKey { origin: String },

    /// Key bytes that decode as PEM/DER but are not a valid key.
    #[error("{origin}: invalid key: {reason}")]
    InvalidKey { origin: String, reason: String },

    /// A PEM file or directory without any usable key.
    #[error("{origin}: no {expected} found; expected a PEM block `-----BEGIN {expected}-----`")]
    NoKeysFound {
        origin: String,
        expected: &'static str,
    },

    /// An encrypted private key, which this crate cannot decrypt.
    #[error(
        "{origin}: encrypted private keys (PEM {label:?}) are not supported for signing here; \
         {hint}"
    )]
    EncryptedPrivateKey {
        origin: String,
        label: String,
        hint: &'static str,
    },

    /// A file operation failed. The I/O error is part of the message rather than a
    /// `source()`, so error-chain printers (anyhow's `{:#}`) do not repeat it.
    #[error("{action} {path}: {error}")]
    Io {
        action: &'static str,
        path: PathBuf,
        error: io::Error,
    },

    /// Key generation refuses to overwrite an existing file.
    #[error(
        "{path} already exists; refusing to overwrite a key: choose another output directory \
         or remove the file first"
    )]
    AlreadyExists { path: PathBuf },

    /// A signature bundle file is not valid JSON of the expected shape (the JSON error,
    /// with line and column, is part of the message).
    #[error("{origin}: malformed signature bundle: {error}")]
    MalformedBundle {
        origin: String,
        error: serde_json::Error,
    },
}

impl TrustError {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, error: io::Error) -> Self {
        TrustError::Io {
            action,
            path: path.into(),
            error,
        }
    }
}

/// Why one signature did not verify against one (or no) trust root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Attempt {
    /// Index of the signature in the list that was verified.
    pub index: usize,
    /// The signature's algorithm.
    pub algorithm: Algorithm,
    /// The trust root that was tried, if one was.
    pub key_id: Option<KeyId>,
    /// Where that trust root was loaded from (file path or label).
    pub origin: Option<String>,
    /// What failed.
    pub reason: String,
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "signature #{} ({})", self.index, self.algorithm)?;
        if let Some(id) = &self.key_id {
            write!(f, " against key {id}")?;
            if let Some(origin) = &self.origin {
                write!(f, " from {origin}")?;
            }
        }
        write!(f, ": {}", self.reason)
    }
}

/// Every failed attempt of one verification, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attempts(pub Vec<Attempt>);

impl fmt::Display for Attempts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, attempt) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{attempt}")?;
        }
        Ok(())
    }
}
