//! Signature entries and the signature bundle file.
//!
//! A [`PluginSignature`] has the shape of one entry of a Plugin resource's
//! `spec.signatures`; a [`SignatureBundle`] is what `kubectl bosun plugin sign` writes
//! next to a plugin (`plugin.wasm.sig.json`): the statement's fields plus the signatures,
//! so the bundle alone says what to pin and what to list in the Plugin resource.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::keys::{Algorithm, RawSignature, parse_key_id_reference};
use crate::roots::TrustRoots;
use crate::statement::Statement;
use crate::verify::{Verified, verify};
use crate::{Digest, TrustError};

/// One signature over a plugin's [`Statement`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginSignature {
    /// `ed25519` or `ecdsa-p256-sha256`.
    pub algorithm: Algorithm,
    /// The signer's key id (`sha256:` + hex, at least 16 digits). Optional: without it,
    /// every trust root of the algorithm is tried (cosign signatures carry none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_id: Option<String>,
    /// The signature, base64 (standard alphabet): 64 raw bytes for Ed25519, ASN.1 DER
    /// for ECDSA (exactly what `cosign sign-blob` prints).
    pub signature: String,
}

impl PluginSignature {
    /// The entry for a signature printed by `cosign sign-blob` (or `openssl dgst -sha256
    /// -sign ... | base64 -w0`) over the statement: base64 of an ASN.1 DER ECDSA P-256
    /// signature. Surrounding whitespace is dropped; no key id is recorded, since cosign
    /// prints none (verification then tries every P-256 trust root).
    ///
    /// # Errors
    /// [`TrustError::MalformedSignature`] when the text is not base64 of a DER signature.
    pub fn from_cosign(base64_text: &str) -> Result<Self, TrustError> {
        let entry = PluginSignature {
            algorithm: Algorithm::EcdsaP256Sha256,
            key_id: None,
            signature: base64_text.trim().to_owned(),
        };
        entry.check(0)?;
        Ok(entry)
    }

    /// Checks that the entry decodes (base64, signature length or DER, key id form)
    /// without verifying it; `index` is used in the error.
    ///
    /// # Errors
    /// [`TrustError::MalformedSignature`].
    pub fn check(&self, index: usize) -> Result<(), TrustError> {
        self.decode(index).map(|_| ())
    }

    pub(crate) fn decode(&self, index: usize) -> Result<RawSignature, TrustError> {
        let malformed = |reason: String| TrustError::MalformedSignature {
            index,
            algorithm: self.algorithm,
            reason,
        };
        if let Some(reference) = &self.key_id {
            parse_key_id_reference(reference).map_err(|e| malformed(e.to_string()))?;
        }
        RawSignature::decode(self.algorithm, &self.signature).map_err(malformed)
    }
}

/// The file written next to a plugin: what was signed, and the signatures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SignatureBundle {
    /// The plugin name.
    pub name: String,
    /// The plugin version.
    pub version: String,
    /// The plugin digest, `sha256:<64 hex>`: the value for the Plugin's `spec.sha256`
    /// (the bare 64 hex digits are accepted on input).
    pub sha256: Digest,
    /// The signatures, in the order they were added.
    #[serde(default)]
    pub signatures: Vec<PluginSignature>,
}

impl SignatureBundle {
    /// A bundle for a statement, without signatures yet.
    #[must_use]
    pub fn new(statement: &Statement) -> Self {
        SignatureBundle {
            name: statement.name().to_owned(),
            version: statement.version().to_owned(),
            sha256: *statement.digest(),
            signatures: Vec::new(),
        }
    }

    /// The statement the signatures should cover.
    ///
    /// # Errors
    /// [`TrustError::InvalidName`] or [`TrustError::InvalidVersion`] for a hand-edited
    /// bundle.
    pub fn statement(&self) -> Result<Statement, TrustError> {
        Statement::new(self.name.clone(), self.version.clone(), self.sha256)
    }

    /// Adds a signature unless an identical one is already there; returns whether it was
    /// added. Signing twice with the same Ed25519 key therefore keeps one entry.
    pub fn add(&mut self, signature: PluginSignature) -> bool {
        if self.signatures.contains(&signature) {
            return false;
        }
        self.signatures.push(signature);
        true
    }

    /// Checks `bytes` against the bundle's digest and its signatures against `roots`.
    ///
    /// # Errors
    /// As [`verify`].
    pub fn verify(&self, bytes: &[u8], roots: &TrustRoots) -> Result<Verified, TrustError> {
        verify(
            bytes,
            &self.sha256,
            &self.name,
            &self.version,
            &self.signatures,
            roots,
        )
    }

    /// Pretty JSON with a trailing newline.
    #[must_use]
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("a bundle always serializes");
        s.push('\n');
        s
    }

    /// Parses bundle JSON; `origin` names the input in errors.
    ///
    /// # Errors
    /// [`TrustError::MalformedBundle`].
    pub fn from_json(json: &str, origin: &str) -> Result<Self, TrustError> {
        serde_json::from_str(json).map_err(|error| TrustError::MalformedBundle {
            origin: origin.to_owned(),
            error,
        })
    }

    /// Reads a bundle file.
    ///
    /// # Errors
    /// [`TrustError::Io`] or [`TrustError::MalformedBundle`].
    pub fn read(path: impl AsRef<Path>) -> Result<Self, TrustError> {
        let path = path.as_ref();
        let text = fs::read_to_string(path).map_err(|e| TrustError::io("reading", path, e))?;
        SignatureBundle::from_json(&text, &path.display().to_string())
    }

    /// Writes the bundle file (replacing it).
    ///
    /// # Errors
    /// [`TrustError::Io`].
    pub fn write(&self, path: impl AsRef<Path>) -> Result<(), TrustError> {
        let path = path.as_ref();
        fs::write(path, self.to_json()).map_err(|e| TrustError::io("writing", path, e))
    }

    /// Where the bundle for a plugin file lives: `<plugin file>.sig.json`.
    #[must_use]
    pub fn path_for(plugin: impl AsRef<Path>) -> PathBuf {
        let mut name = plugin.as_ref().as_os_str().to_owned();
        name.push(".sig.json");
        PathBuf::from(name)
    }
}
