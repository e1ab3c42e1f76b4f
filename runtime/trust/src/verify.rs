//! Verification: pinned digest first, then at least one signature from a trust root.

use crate::bundle::PluginSignature;
use crate::error::{Attempt, Attempts};
use crate::keys::{Algorithm, KeyId};
use crate::roots::TrustRoots;
use crate::statement::Statement;
use crate::{Digest, TrustError};

/// Proof that a plugin passed verification: which statement, and which trust root
/// vouched for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The statement that was signed (name, version and the digest of the bytes).
    pub statement: Statement,
    /// The algorithm of the signature that verified.
    pub algorithm: Algorithm,
    /// The trust root that verified it.
    pub key_id: KeyId,
    /// Where that trust root was loaded from.
    pub origin: String,
    /// The index of the signature that verified, in the list given.
    pub signature_index: usize,
}

/// Verifies plugin bytes: they must hash to `expected`, and at least one of `signatures`
/// must be a valid signature, by a key in `roots`, over the [`Statement`] of `name`,
/// `version` and that digest.
///
/// The digest is checked before anything else, so bytes that were tampered with are
/// reported as such whatever their signatures say.
///
/// # Errors
/// [`TrustError::DigestMismatch`], then the errors of [`verify_digest`].
pub fn verify(
    bytes: &[u8],
    expected: &Digest,
    name: &str,
    version: &str,
    signatures: &[PluginSignature],
    roots: &TrustRoots,
) -> Result<Verified, TrustError> {
    let found = Digest::of(bytes);
    if found != *expected {
        return Err(TrustError::DigestMismatch {
            expected: *expected,
            found,
        });
    }
    verify_digest(expected, name, version, signatures, roots)
}

/// Verifies signatures over the statement of `name`, `version` and `digest`, for callers
/// that have already hashed the bytes themselves (the host's cache, keyed by digest).
/// The caller is responsible for `digest` really being the hash of the bytes it will run.
///
/// # Errors
/// [`TrustError::InvalidName`], [`TrustError::InvalidVersion`], then the errors of
/// [`verify_statement`].
pub fn verify_digest(
    digest: &Digest,
    name: &str,
    version: &str,
    signatures: &[PluginSignature],
    roots: &TrustRoots,
) -> Result<Verified, TrustError> {
    let statement = Statement::new(name, version, *digest)?;
    verify_statement(&statement, signatures, roots)
}

/// Verifies that at least one signature over `statement` is by a trust root.
///
/// Every signature entry must decode (a garbled entry is a configuration error worth
/// fixing, so it fails verification even if another entry would verify). An entry with a
/// `keyId` is checked only against that root; one without is checked against every root
/// of its algorithm. The first signature that verifies wins.
///
/// # Errors
/// [`TrustError::NoSignatures`], [`TrustError::NoTrustRoots`],
/// [`TrustError::MalformedSignature`], or [`TrustError::Untrusted`] listing every attempt
/// and why it failed.
pub fn verify_statement(
    statement: &Statement,
    signatures: &[PluginSignature],
    roots: &TrustRoots,
) -> Result<Verified, TrustError> {
    if signatures.is_empty() {
        return Err(TrustError::NoSignatures {
            name: statement.name().to_owned(),
            version: statement.version().to_owned(),
        });
    }
    if roots.is_empty() {
        return Err(TrustError::NoTrustRoots);
    }
    let decoded = signatures
        .iter()
        .enumerate()
        .map(|(index, entry)| entry.decode(index))
        .collect::<Result<Vec<_>, _>>()?;

    let message = statement.to_bytes();
    let mut attempts = Vec::new();
    for (index, (entry, raw)) in signatures.iter().zip(&decoded).enumerate() {
        let mut tried_any = false;
        for root in roots
            .iter()
            .filter(|r| r.key.algorithm() == entry.algorithm)
        {
            if let Some(reference) = &entry.key_id {
                // The form was validated above, so this cannot fail.
                if !root.key_id.matches(reference).unwrap_or(false) {
                    continue;
                }
            }
            tried_any = true;
            match root.key.verify_raw(&message, raw) {
                Ok(()) => {
                    return Ok(Verified {
                        statement: statement.clone(),
                        algorithm: entry.algorithm,
                        key_id: root.key_id,
                        origin: root.origin.clone(),
                        signature_index: index,
                    });
                }
                Err(reason) => attempts.push(Attempt {
                    index,
                    algorithm: entry.algorithm,
                    key_id: Some(root.key_id),
                    origin: Some(root.origin.clone()),
                    reason: format!(
                        "{reason}: it was made by another key, or over another name, version \
                         or digest"
                    ),
                }),
            }
        }
        if !tried_any {
            let reason = match &entry.key_id {
                Some(reference) => format!(
                    "signed by key {reference}, which is not among the {} trust roots",
                    roots.len()
                ),
                None => format!(
                    "none of the trust roots is an {} key",
                    entry.algorithm.key_type()
                ),
            };
            attempts.push(Attempt {
                index,
                algorithm: entry.algorithm,
                key_id: None,
                origin: None,
                reason,
            });
        }
    }
    Err(TrustError::Untrusted {
        name: statement.name().to_owned(),
        version: statement.version().to_owned(),
        digest: *statement.digest(),
        attempts: Attempts(attempts),
    })
}
