//! Plugin trust: which exact bytes may run, and who vouched for them.
//!
//! This crate owns the trust decision that the wasm host makes before it compiles a
//! plugin, and the primitives `kubectl bosun plugin keygen | sign | verify | inspect` are
//! built from. It does no networking and knows nothing about Kubernetes.
//!
//! # Trust model
//!
//! A plugin runs only when **both** hold:
//!
//! 1. **Pin.** Its bytes hash to the SHA-256 [`Digest`] pinned in the Plugin resource
//!    (`spec.sha256`). The pin says *which bytes*; nothing else about the plugin (its
//!    source URL, its file name, what it says about itself) is trusted.
//! 2. **Signature.** At least one entry of `spec.signatures` is a valid signature, by a
//!    key among the administrator's [`TrustRoots`], over the [`Statement`] that binds the
//!    plugin's name, version and that digest. Binding name and version stops a signer's
//!    approval of one plugin being replayed for the same bytes under another identity.
//!
//! Signatures are Ed25519 (made by `kubectl bosun plugin keygen/sign` or `openssl`,
//! verified with `verify_strict`, which refuses small-order keys and malleable
//! signatures) or ECDSA P-256 over SHA-256 (made by `cosign sign-blob` or `openssl dgst
//! -sha256 -sign`), so teams can sign with the tool they already use.
//!
//! Trust roots are plain public keys (SPKI PEM) chosen by the administrator; there is no
//! certificate chain, transparency log or key expiry. Removing a key from the trust roots
//! is how a key is revoked. An empty set of trust roots trusts nothing.
//!
//! # Use
//!
//! ```
//! use bosun_trust::{Digest, SigningKey, Statement, TrustRoots, verify};
//!
//! let plugin = b"\0asm...the plugin's bytes";
//! let key = SigningKey::generate_ed25519();
//! let statement = Statement::new("hello", "0.1.0", Digest::of(plugin))?;
//! let signature = key.sign_statement(&statement);
//!
//! let mut roots = TrustRoots::new();
//! roots.add_pem(&key.public_key().to_pem(), "admin.pub")?;
//! let verified = verify(plugin, statement.digest(), "hello", "0.1.0", &[signature], &roots)?;
//! assert_eq!(verified.key_id, key.public_key().key_id());
//! # Ok::<(), bosun_trust::TrustError>(())
//! ```

pub mod bundle;
pub mod digest;
mod error;
pub mod keys;
pub mod roots;
pub mod statement;
pub mod verify;

pub use bundle::{PluginSignature, SignatureBundle};
pub use digest::{Digest, Hasher};
pub use error::{Attempt, Attempts, TrustError};
pub use keys::{Algorithm, KeyId, KeyPairFiles, PublicKey, SigningKey, write_key_pair};
pub use roots::{TrustRoot, TrustRoots};
pub use statement::{STATEMENT_HEADER, Statement};
pub use verify::{Verified, verify, verify_digest, verify_statement};
