//! Keys: the two signature algorithms, public keys read from SPKI PEM, signing keys read
//! from PKCS#8 PEM, key generation, and key ids.
//!
//! The file formats are the ones `openssl` and `cosign` use, so keys move freely between
//! the tools: a private key is PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`, what
//! `openssl genpkey -algorithm ed25519` writes) and a public key is SPKI PEM
//! (`-----BEGIN PUBLIC KEY-----`, what `openssl pkey -pubout` and `cosign
//! generate-key-pair` write).

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::pkcs8::KeypairBytes;
use p256::ecdsa::signature::Signer as _;
// The `pkcs8` crate (shared by p256 and ed25519-dalek), with its `der` and `spki`.
use p256::pkcs8::der::zeroize::Zeroizing;
use p256::pkcs8::der::{self, Decode as _};
use p256::pkcs8::spki::{self, DecodePublicKey as _, EncodePublicKey as _};
use p256::pkcs8::{
    DecodePrivateKey as _, EncodePrivateKey as _, LineEnding, ObjectIdentifier, PrivateKeyInfo,
};
use rand_core::OsRng;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::bundle::PluginSignature;
use crate::statement::Statement;
use crate::{Digest, TrustError};

const OID_ED25519: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.101.112");
const OID_EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const OID_P256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");

/// A signature algorithm Bosun accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Algorithm {
    /// Pure Ed25519 (RFC 8032) over the statement bytes, verified strictly. The signature
    /// is the raw 64 bytes.
    #[serde(rename = "ed25519")]
    Ed25519,
    /// ECDSA over NIST P-256 of the SHA-256 of the statement bytes, as `cosign sign-blob`
    /// and `openssl dgst -sha256 -sign` produce. The signature is ASN.1 DER.
    #[serde(rename = "ecdsa-p256-sha256")]
    EcdsaP256Sha256,
}

impl Algorithm {
    /// The name used in signature bundles and `spec.signatures`.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Algorithm::Ed25519 => "ed25519",
            Algorithm::EcdsaP256Sha256 => "ecdsa-p256-sha256",
        }
    }
}

impl Algorithm {
    /// The kind of key that makes signatures of this algorithm, for messages.
    #[must_use]
    pub const fn key_type(self) -> &'static str {
        match self {
            Algorithm::Ed25519 => "Ed25519",
            Algorithm::EcdsaP256Sha256 => "ECDSA P-256",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Algorithm {
    type Err = TrustError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ed25519" => Ok(Algorithm::Ed25519),
            "ecdsa-p256-sha256" => Ok(Algorithm::EcdsaP256Sha256),
            other => Err(TrustError::UnknownAlgorithm(other.to_owned())),
        }
    }
}

/// A key's identity: the SHA-256 of its canonical SubjectPublicKeyInfo DER encoding (the
/// same bytes `openssl pkey -pubin -outform DER` writes for it).
///
/// `Display` shows the short form `sha256:` + 16 hex digits (64 bits, enough to tell keys
/// of one cluster apart); `{:#}` and [`KeyId::full`] show all 64 digits, which is also the
/// serialized form.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(Digest);

/// How many hex digits the short form of a key id shows, and the least a reference to a
/// key id may give.
pub const KEY_ID_SHORT_HEX: usize = 16;

impl KeyId {
    /// The id of the key whose SPKI DER encoding is `spki_der`.
    #[must_use]
    pub fn of_spki_der(spki_der: &[u8]) -> Self {
        KeyId(Digest::of(spki_der))
    }

    /// `sha256:` and all 64 hex digits.
    #[must_use]
    pub fn full(&self) -> String {
        self.0.to_string()
    }

    /// Whether `reference` (`sha256:` followed by 16 to 64 hex digits, any case) names
    /// this key: it is this id or a prefix of it.
    ///
    /// # Errors
    /// [`TrustError::MalformedKeyId`] when `reference` is not of that form.
    pub fn matches(&self, reference: &str) -> Result<bool, TrustError> {
        let hex_prefix = parse_key_id_reference(reference)?;
        Ok(self.0.to_hex().starts_with(&hex_prefix))
    }

    /// Parses the full form `sha256:<64 hex>`.
    ///
    /// # Errors
    /// [`TrustError::MalformedKeyId`].
    pub fn parse(input: &str) -> Result<Self, TrustError> {
        match input.strip_prefix("sha256:") {
            Some(h) if h.len() == 64 => {
                Digest::parse(input)
                    .map(KeyId)
                    .map_err(|_| TrustError::MalformedKeyId {
                        input: input.to_owned(),
                    })
            }
            _ => Err(TrustError::MalformedKeyId {
                input: input.to_owned(),
            }),
        }
    }
}

/// Checks a key id reference (`sha256:` followed by 16 to 64 hex digits, any case) and
/// returns its hex digits in lower case.
pub(crate) fn parse_key_id_reference(reference: &str) -> Result<String, TrustError> {
    reference
        .strip_prefix("sha256:")
        .filter(|h| {
            (KEY_ID_SHORT_HEX..=64).contains(&h.len()) && h.bytes().all(|b| b.is_ascii_hexdigit())
        })
        .map(str::to_ascii_lowercase)
        .ok_or_else(|| TrustError::MalformedKeyId {
            input: reference.to_owned(),
        })
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            write!(f, "{}", self.0)
        } else {
            write!(f, "sha256:{}", &self.0.to_hex()[..KEY_ID_SHORT_HEX])
        }
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

impl Serialize for KeyId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.full())
    }
}

impl<'de> Deserialize<'de> for KeyId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        KeyId::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A public key that can be a trust root.
#[derive(Clone, PartialEq, Eq)]
pub enum PublicKey {
    /// An Ed25519 key (never a weak, small-order one: construction refuses those).
    Ed25519(ed25519_dalek::VerifyingKey),
    /// An ECDSA key on NIST P-256.
    EcdsaP256(p256::ecdsa::VerifyingKey),
}

impl PublicKey {
    /// Reads a DER SubjectPublicKeyInfo, detecting the algorithm from it.
    ///
    /// # Errors
    /// [`TrustError::UnsupportedKey`] for any algorithm but Ed25519 and EC P-256,
    /// [`TrustError::WeakKey`] for a small-order Ed25519 key, [`TrustError::InvalidKey`]
    /// when the DER or the point is invalid. `origin` names the input in messages.
    pub fn from_spki_der(der: &[u8], origin: &str) -> Result<Self, TrustError> {
        let invalid = |reason: String| TrustError::InvalidKey {
            origin: origin.to_owned(),
            reason,
        };
        let info = spki::SubjectPublicKeyInfoRef::from_der(der)
            .map_err(|e| invalid(format!("not a DER SubjectPublicKeyInfo: {e}")))?;
        let algorithm = info.algorithm.oid;
        if algorithm == OID_ED25519 {
            let key = ed25519_dalek::VerifyingKey::from_public_key_der(der)
                .map_err(|e| invalid(format!("bad Ed25519 key: {e}")))?;
            if key.is_weak() {
                return Err(TrustError::WeakKey {
                    origin: origin.to_owned(),
                });
            }
            Ok(PublicKey::Ed25519(key))
        } else if algorithm == OID_EC_PUBLIC_KEY {
            let curve = info
                .algorithm
                .parameters_oid()
                .map_err(|e| invalid(format!("EC key without a named curve: {e}")))?;
            if curve != OID_P256 {
                return Err(TrustError::UnsupportedKey {
                    origin: origin.to_owned(),
                    algorithm: format!("EC on curve {}", curve_name(curve)),
                });
            }
            let key = p256::ecdsa::VerifyingKey::from_public_key_der(der)
                .map_err(|e| invalid(format!("bad P-256 key: {e}")))?;
            Ok(PublicKey::EcdsaP256(key))
        } else {
            Err(TrustError::UnsupportedKey {
                origin: origin.to_owned(),
                algorithm: algorithm_name(algorithm),
            })
        }
    }

    /// Reads exactly one `PUBLIC KEY` PEM block.
    ///
    /// # Errors
    /// As [`PublicKey::from_spki_der`], plus [`TrustError::MalformedPem`],
    /// [`TrustError::NoKeysFound`], [`TrustError::PrivateKeyInTrustRoots`], and
    /// [`TrustError::InvalidKey`] when the text holds more than one key.
    pub fn from_pem(pem: &str, origin: &str) -> Result<Self, TrustError> {
        let mut keys = public_keys_from_pem(pem, origin)?;
        match keys.len() {
            1 => Ok(keys.remove(0)),
            n => Err(TrustError::InvalidKey {
                origin: origin.to_owned(),
                reason: format!("holds {n} public keys, expected exactly one"),
            }),
        }
    }

    /// The algorithm signatures under this key use.
    #[must_use]
    pub fn algorithm(&self) -> Algorithm {
        match self {
            PublicKey::Ed25519(_) => Algorithm::Ed25519,
            PublicKey::EcdsaP256(_) => Algorithm::EcdsaP256Sha256,
        }
    }

    /// The canonical SPKI DER encoding (EC points uncompressed).
    #[must_use]
    pub fn to_spki_der(&self) -> Vec<u8> {
        let doc = match self {
            PublicKey::Ed25519(k) => k.to_public_key_der(),
            PublicKey::EcdsaP256(k) => k.to_public_key_der(),
        };
        // Encoding a valid key into a Vec cannot fail: the only errors are length overflow
        // and writer errors, neither possible here.
        doc.expect("encoding a valid public key as SPKI DER")
            .into_vec()
    }

    /// SPKI PEM (`-----BEGIN PUBLIC KEY-----`), LF line endings.
    #[must_use]
    pub fn to_pem(&self) -> String {
        der::pem::encode_string("PUBLIC KEY", LineEnding::LF, &self.to_spki_der())
            .expect("PEM-encoding a small DER document")
    }

    /// This key's id.
    #[must_use]
    pub fn key_id(&self) -> KeyId {
        KeyId::of_spki_der(&self.to_spki_der())
    }

    /// Verifies raw signature bytes over `message`: strict Ed25519, or ECDSA P-256 over
    /// SHA-256(message) with a DER signature. Returns why it failed.
    pub(crate) fn verify_raw(
        &self,
        message: &[u8],
        signature: &RawSignature,
    ) -> Result<(), String> {
        match (self, signature) {
            (PublicKey::Ed25519(key), RawSignature::Ed25519(sig)) => key
                .verify_strict(message, sig)
                .map_err(|_| "signature does not verify (strict Ed25519)".to_owned()),
            (PublicKey::EcdsaP256(key), RawSignature::EcdsaP256(sig)) => {
                use p256::ecdsa::signature::Verifier as _;
                key.verify(message, sig)
                    .map_err(|_| "signature does not verify (ECDSA P-256/SHA-256)".to_owned())
            }
            (key, sig) => Err(format!(
                "key is {}, signature is {}",
                key.algorithm(),
                sig.algorithm()
            )),
        }
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({} {})", self.algorithm(), self.key_id())
    }
}

/// A decoded signature, ready to check.
#[derive(Clone, Debug)]
pub(crate) enum RawSignature {
    Ed25519(ed25519_dalek::Signature),
    EcdsaP256(p256::ecdsa::Signature),
}

impl RawSignature {
    /// Decodes base64 (standard alphabet, surrounding whitespace ignored, as `cosign` and
    /// `base64` print it) into a signature of `algorithm`.
    pub(crate) fn decode(algorithm: Algorithm, base64_text: &str) -> Result<Self, String> {
        let bytes = BASE64
            .decode(base64_text.trim())
            .map_err(|e| format!("not base64: {e}"))?;
        match algorithm {
            Algorithm::Ed25519 => {
                let arr: [u8; 64] = bytes.as_slice().try_into().map_err(|_| {
                    format!("an Ed25519 signature is 64 bytes, found {}", bytes.len())
                })?;
                Ok(RawSignature::Ed25519(ed25519_dalek::Signature::from_bytes(
                    &arr,
                )))
            }
            Algorithm::EcdsaP256Sha256 => p256::ecdsa::Signature::from_der(&bytes)
                .map(RawSignature::EcdsaP256)
                .map_err(|e| format!("not an ASN.1 DER ECDSA P-256 signature: {e}")),
        }
    }

    fn algorithm(&self) -> Algorithm {
        match self {
            RawSignature::Ed25519(_) => Algorithm::Ed25519,
            RawSignature::EcdsaP256(_) => Algorithm::EcdsaP256Sha256,
        }
    }
}

/// A private key that signs statements.
#[derive(Clone)]
pub enum SigningKey {
    /// Ed25519 (what `kubectl bosun plugin keygen` makes).
    Ed25519(ed25519_dalek::SigningKey),
    /// ECDSA P-256 (for teams whose keys are P-256; cosign's own encrypted key format is
    /// not read here: sign with `cosign sign-blob` instead).
    EcdsaP256(p256::ecdsa::SigningKey),
}

impl SigningKey {
    /// A fresh Ed25519 key from the operating system's random source.
    #[must_use]
    pub fn generate_ed25519() -> Self {
        SigningKey::Ed25519(ed25519_dalek::SigningKey::generate(&mut OsRng))
    }

    /// A fresh P-256 key from the operating system's random source.
    #[must_use]
    pub fn generate_p256() -> Self {
        SigningKey::EcdsaP256(p256::ecdsa::SigningKey::random(&mut OsRng))
    }

    /// Reads a private key from PEM: PKCS#8 `PRIVATE KEY` (Ed25519 or P-256), or SEC1
    /// `EC PRIVATE KEY` (P-256, as `openssl ecparam -genkey` writes).
    ///
    /// # Errors
    /// [`TrustError::EncryptedPrivateKey`] for encrypted PKCS#8 and cosign keys (with
    /// what to do instead), [`TrustError::UnsupportedKey`], [`TrustError::InvalidKey`],
    /// [`TrustError::MalformedPem`], [`TrustError::NoKeysFound`].
    pub fn from_pem(pem: &str, origin: &str) -> Result<Self, TrustError> {
        let blocks = pem_blocks(pem, origin)?;
        let mut found = None;
        for (label, der) in blocks {
            let key = match label.as_str() {
                "PRIVATE KEY" => Self::from_pkcs8_der(&der, origin)?,
                "EC PRIVATE KEY" => {
                    let secret = p256::SecretKey::from_sec1_der(&der).map_err(|e| {
                        TrustError::InvalidKey {
                            origin: origin.to_owned(),
                            reason: format!("not a SEC1 P-256 private key: {e}"),
                        }
                    })?;
                    SigningKey::EcdsaP256(secret.into())
                }
                "ENCRYPTED PRIVATE KEY" => {
                    return Err(TrustError::EncryptedPrivateKey {
                        origin: origin.to_owned(),
                        label,
                        hint: "decrypt it first (`openssl pkey -in KEY -out PLAIN.key`) and keep \
                               the result private",
                    });
                }
                l if l.contains("SIGSTORE") || l.contains("COSIGN") => {
                    return Err(TrustError::EncryptedPrivateKey {
                        origin: origin.to_owned(),
                        label,
                        hint: "make the signature with cosign instead: `kubectl bosun plugin \
                               statement FILE > stmt`, `cosign sign-blob --key KEY stmt`, then \
                               `kubectl bosun plugin sign FILE --cosign-signature SIG` (see \
                               docs/trust.md)",
                    });
                }
                _ => continue,
            };
            if found.replace(key).is_some() {
                return Err(TrustError::InvalidKey {
                    origin: origin.to_owned(),
                    reason: "holds more than one private key, expected exactly one".into(),
                });
            }
        }
        found.ok_or_else(|| TrustError::NoKeysFound {
            origin: origin.to_owned(),
            expected: "PRIVATE KEY",
        })
    }

    /// Reads a private key PEM file (see [`SigningKey::from_pem`]).
    ///
    /// # Errors
    /// [`TrustError::Io`] and the parsing errors.
    pub fn read_pem_file(path: impl AsRef<Path>) -> Result<Self, TrustError> {
        let path = path.as_ref();
        let text = fs::read_to_string(path).map_err(|e| TrustError::io("reading", path, e))?;
        SigningKey::from_pem(&text, &path.display().to_string())
    }

    fn from_pkcs8_der(der: &[u8], origin: &str) -> Result<Self, TrustError> {
        let invalid = |reason: String| TrustError::InvalidKey {
            origin: origin.to_owned(),
            reason,
        };
        let info = PrivateKeyInfo::from_der(der)
            .map_err(|e| invalid(format!("not a PKCS#8 private key: {e}")))?;
        let algorithm = info.algorithm.oid;
        if algorithm == OID_ED25519 {
            ed25519_dalek::SigningKey::from_pkcs8_der(der)
                .map(SigningKey::Ed25519)
                .map_err(|e| invalid(format!("bad Ed25519 private key: {e}")))
        } else if algorithm == OID_EC_PUBLIC_KEY {
            let curve = info
                .algorithm
                .parameters_oid()
                .map_err(|e| invalid(format!("EC key without a named curve: {e}")))?;
            if curve != OID_P256 {
                return Err(TrustError::UnsupportedKey {
                    origin: origin.to_owned(),
                    algorithm: format!("EC on curve {}", curve_name(curve)),
                });
            }
            p256::ecdsa::SigningKey::from_pkcs8_der(der)
                .map(SigningKey::EcdsaP256)
                .map_err(|e| invalid(format!("bad P-256 private key: {e}")))
        } else {
            Err(TrustError::UnsupportedKey {
                origin: origin.to_owned(),
                algorithm: algorithm_name(algorithm),
            })
        }
    }

    /// PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`), LF line endings. For Ed25519 this is
    /// the RFC 8410 v1 form without the public key, byte-for-byte what `openssl genpkey
    /// -algorithm ed25519` writes. The string is wiped from memory when dropped.
    #[must_use]
    pub fn to_pkcs8_pem(&self) -> Zeroizing<String> {
        let pem = match self {
            SigningKey::Ed25519(k) => KeypairBytes {
                secret_key: k.to_bytes(),
                public_key: None,
            }
            .to_pkcs8_pem(LineEnding::LF),
            SigningKey::EcdsaP256(k) => k.to_pkcs8_pem(LineEnding::LF),
        };
        pem.expect("PKCS#8-encoding a valid private key")
    }

    /// The matching public key.
    #[must_use]
    pub fn public_key(&self) -> PublicKey {
        match self {
            SigningKey::Ed25519(k) => PublicKey::Ed25519(k.verifying_key()),
            SigningKey::EcdsaP256(k) => PublicKey::EcdsaP256(*k.verifying_key()),
        }
    }

    /// The algorithm of signatures this key makes.
    #[must_use]
    pub fn algorithm(&self) -> Algorithm {
        self.public_key().algorithm()
    }

    /// Signs arbitrary bytes, returning the raw signature: 64 bytes for Ed25519, ASN.1 DER
    /// for ECDSA (over SHA-256 of `message`, deterministic per RFC 6979).
    #[must_use]
    pub fn sign_bytes(&self, message: &[u8]) -> Vec<u8> {
        match self {
            SigningKey::Ed25519(k) => k.sign(message).to_bytes().to_vec(),
            SigningKey::EcdsaP256(k) => {
                let sig: p256::ecdsa::Signature = k.sign(message);
                sig.to_der().as_bytes().to_vec()
            }
        }
    }

    /// Signs a statement, giving the entry to add to a bundle or `spec.signatures`.
    #[must_use]
    pub fn sign_statement(&self, statement: &Statement) -> PluginSignature {
        PluginSignature {
            algorithm: self.algorithm(),
            key_id: Some(self.public_key().key_id().full()),
            signature: BASE64.encode(self.sign_bytes(&statement.to_bytes())),
        }
    }
}

impl fmt::Debug for SigningKey {
    // Never print key material.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SigningKey({} {})",
            self.algorithm(),
            self.public_key().key_id()
        )
    }
}

/// The files [`write_key_pair`] created.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyPairFiles {
    /// The private key, PKCS#8 PEM, mode 0600.
    pub private_key: PathBuf,
    /// The public key, SPKI PEM, mode 0644: the file to add to the trust roots.
    pub public_key: PathBuf,
    /// The public key's id.
    pub key_id: KeyId,
}

/// Writes `<dir>/<stem>.key` (private, created with mode 0600) and `<dir>/<stem>.pub`
/// (public), creating `dir` if needed. Never overwrites: if either file exists nothing is
/// written.
///
/// # Errors
/// [`TrustError::AlreadyExists`] or [`TrustError::Io`].
pub fn write_key_pair(
    dir: impl AsRef<Path>,
    stem: &str,
    key: &SigningKey,
) -> Result<KeyPairFiles, TrustError> {
    let dir = dir.as_ref();
    fs::create_dir_all(dir).map_err(|e| TrustError::io("creating directory", dir, e))?;
    let private_key = dir.join(format!("{stem}.key"));
    let public_key = dir.join(format!("{stem}.pub"));
    for path in [&private_key, &public_key] {
        if fs::symlink_metadata(path).is_ok() {
            return Err(TrustError::AlreadyExists { path: path.clone() });
        }
    }
    write_new(&private_key, key.to_pkcs8_pem().as_bytes(), 0o600)?;
    let public = key.public_key();
    write_new(&public_key, public.to_pem().as_bytes(), 0o644)?;
    Ok(KeyPairFiles {
        private_key,
        public_key,
        key_id: public.key_id(),
    })
}

fn write_new(path: &Path, contents: &[u8], mode: u32) -> Result<(), TrustError> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        // The mode is applied at creation, so the private key is never readable by others,
        // not even briefly.
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            TrustError::AlreadyExists {
                path: path.to_owned(),
            }
        } else {
            TrustError::io("creating", path, e)
        }
    })?;
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .map_err(|e| TrustError::io("writing", path, e))
}

/// Splits PEM text into its blocks, decoding each. Text outside blocks is ignored (openssl
/// and others sometimes print explanations around them).
pub(crate) fn pem_blocks(text: &str, origin: &str) -> Result<Vec<(String, Vec<u8>)>, TrustError> {
    let malformed = |reason: String| TrustError::MalformedPem {
        origin: origin.to_owned(),
        reason,
    };
    let mut blocks = Vec::new();
    let mut lines = text.lines().enumerate();
    while let Some((start, line)) = lines.next() {
        let Some(label) = line
            .trim_end()
            .strip_prefix("-----BEGIN ")
            .and_then(|l| l.strip_suffix("-----"))
        else {
            continue;
        };
        let end_line = format!("-----END {label}-----");
        let mut block = format!("{}\n", line.trim_end());
        let mut closed = false;
        for (_, inner) in lines.by_ref() {
            block.push_str(inner.trim_end());
            block.push('\n');
            if inner.trim_end() == end_line {
                closed = true;
                break;
            }
        }
        if !closed {
            return Err(malformed(format!(
                "block `-----BEGIN {label}-----` on line {} has no `{end_line}`",
                start + 1
            )));
        }
        let (decoded_label, der) = der::pem::decode_vec(block.as_bytes()).map_err(|e| {
            malformed(format!(
                "block `{label}` starting on line {}: {e}",
                start + 1
            ))
        })?;
        blocks.push((decoded_label.to_owned(), der));
    }
    Ok(blocks)
}

/// Every `PUBLIC KEY` block of a PEM text as a key. Private keys are refused (they do not
/// belong among trust roots); other blocks (certificates, parameters) are an error too,
/// since a trust-root file that holds them was probably meant to be something else.
pub(crate) fn public_keys_from_pem(text: &str, origin: &str) -> Result<Vec<PublicKey>, TrustError> {
    let mut keys = Vec::new();
    for (label, der) in pem_blocks(text, origin)? {
        match label.as_str() {
            "PUBLIC KEY" => keys.push(PublicKey::from_spki_der(&der, origin)?),
            l if l.contains("PRIVATE KEY") => {
                return Err(TrustError::PrivateKeyInTrustRoots {
                    origin: origin.to_owned(),
                    label,
                });
            }
            _ => {
                return Err(TrustError::UnsupportedKey {
                    origin: origin.to_owned(),
                    algorithm: format!(
                        "PEM block {label:?} (only `PUBLIC KEY` blocks are trust roots)"
                    ),
                });
            }
        }
    }
    if keys.is_empty() {
        return Err(TrustError::NoKeysFound {
            origin: origin.to_owned(),
            expected: "PUBLIC KEY",
        });
    }
    Ok(keys)
}

fn algorithm_name(oid: ObjectIdentifier) -> String {
    let name = match oid.to_string().as_str() {
        "1.2.840.113549.1.1.1" => "RSA",
        "1.2.840.113549.1.1.10" => "RSA-PSS",
        "1.3.101.113" => "Ed448",
        "1.3.101.110" => "X25519",
        "1.3.101.111" => "X448",
        "1.2.840.10040.4.1" => "DSA",
        _ => return format!("with OID {oid}"),
    };
    format!("{name} (OID {oid})")
}

fn curve_name(oid: ObjectIdentifier) -> String {
    let name = match oid.to_string().as_str() {
        "1.3.132.0.34" => "P-384",
        "1.3.132.0.35" => "P-521",
        "1.3.132.0.10" => "secp256k1",
        _ => return format!("with OID {oid}"),
    };
    format!("{name} (OID {oid})")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Ed25519 identity point (y = 1): a small-order "public key" under which the
    /// all-zero-scalar signature with R = identity satisfies the cofactorless equation for
    /// every message.
    const IDENTITY: [u8; 32] = {
        let mut b = [0u8; 32];
        b[0] = 1;
        b
    };

    fn forged_signature() -> ed25519_dalek::Signature {
        let mut bytes = [0u8; 64];
        bytes[..32].copy_from_slice(&IDENTITY); // R = identity, s = 0
        ed25519_dalek::Signature::from_bytes(&bytes)
    }

    #[test]
    fn small_order_key_forgery_is_rejected_by_strict_verification() {
        use ed25519_dalek::Verifier as _;
        let weak = ed25519_dalek::VerifyingKey::from_bytes(&IDENTITY).unwrap();
        assert!(weak.is_weak());
        let message = b"any statement at all";
        // The forgery is real: non-strict verification accepts it...
        weak.verify(message, &forged_signature())
            .expect("the cofactorless check accepts the small-order forgery");
        // ...and ours refuses it, even when the weak key was put in the trust roots by
        // constructing the variant directly (bypassing the loader's check).
        let key = PublicKey::Ed25519(weak);
        let err = key
            .verify_raw(message, &RawSignature::Ed25519(forged_signature()))
            .unwrap_err();
        assert!(err.contains("strict"), "{err}");
    }

    #[test]
    fn small_order_key_is_refused_as_a_trust_root() {
        // SPKI for Ed25519: SEQUENCE { SEQUENCE { OID 1.3.101.112 }, BIT STRING key }.
        let mut der = hex::decode("302a300506032b6570032100").unwrap();
        der.extend_from_slice(&IDENTITY);
        let err = PublicKey::from_spki_der(&der, "weak.pub").unwrap_err();
        assert!(matches!(err, TrustError::WeakKey { .. }), "{err:?}");
        // The same encoding with a real key loads, so the refusal is about the point.
        let real = SigningKey::generate_ed25519().public_key();
        PublicKey::from_spki_der(&real.to_spki_der(), "real.pub").unwrap();
    }

    #[test]
    fn algorithm_names() {
        for a in [Algorithm::Ed25519, Algorithm::EcdsaP256Sha256] {
            assert_eq!(a.as_str().parse::<Algorithm>().unwrap(), a);
            assert_eq!(serde_json::to_string(&a).unwrap(), format!("\"{a}\""));
        }
        let err = "rsa".parse::<Algorithm>().unwrap_err();
        assert!(err.to_string().contains("expected \"ed25519\""), "{err}");
    }
}
