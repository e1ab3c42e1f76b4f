//! The on-disk cache of compiled plugins.
//!
//! A compiled component is native code: loading it back skips every check wasmtime
//! makes on WebAssembly, so only bytes this host compiled may ever be deserialized.
//! Each entry is keyed by sha256(plugin digest, wasmtime version, the engine's
//! precompile-compatibility hash) and stored next to an HMAC-SHA256 of its bytes under
//! a random key kept in the cache directory (mode 0600, directory 0700). An entry whose
//! MAC does not verify is deleted and recompiled, never loaded.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest as _, Sha256};

const KEY_FILE: &str = "host.key";

/// Feeds `Hash` output into SHA-256, so the engine's compatibility hash becomes a stable
/// byte string rather than a process-dependent `u64`.
struct ShaHasher(Sha256);

impl std::hash::Hasher for ShaHasher {
    fn finish(&self) -> u64 {
        0
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }
}

/// The engine part of every cache key: wasmtime's version and its compatibility hash.
pub(crate) fn engine_fingerprint(engine: &wasmtime::Engine) -> [u8; 32] {
    use std::hash::Hash;
    let mut h = ShaHasher(Sha256::new());
    h.0.update(b"bosun-host-cache-v1 wasmtime ");
    // The wasmtime version is pinned by our Cargo.lock; the compatibility hash covers
    // the engine configuration and the compiler settings.
    h.0.update(wasmtime_version().as_bytes());
    engine.precompile_compatibility_hash().hash(&mut h);
    h.0.finalize().into()
}

/// The version of wasmtime this host is linked against.
pub(crate) fn wasmtime_version() -> &'static str {
    // wasmtime does not export its version as a constant; the dependency is pinned to
    // exactly this release in the workspace (`wasmtime = "48.0.8"` resolves here).
    "48.0.8"
}

fn hmac(key: &[u8; 32], data: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    k[..32].copy_from_slice(key);
    let ipad: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
    let opad: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
    let inner = Sha256::new()
        .chain_update(&ipad)
        .chain_update(data)
        .finalize();
    Sha256::new()
        .chain_update(&opad)
        .chain_update(inner)
        .finalize()
        .into()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A cache directory with its MAC key.
pub(crate) struct DiskCache {
    dir: PathBuf,
    key: [u8; 32],
    fingerprint: [u8; 32],
}

impl DiskCache {
    /// Opens (creating if needed) the cache in `dir`.
    pub(crate) fn open(dir: &Path, fingerprint: [u8; 32]) -> std::io::Result<DiskCache> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
        let key_path = dir.join(KEY_FILE);
        let key = match fs::read(&key_path) {
            Ok(bytes) if bytes.len() == 32 => {
                let mut k = [0u8; 32];
                k.copy_from_slice(&bytes);
                k
            }
            _ => {
                let mut k = [0u8; 32];
                rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut k);
                let tmp = dir.join(format!("{KEY_FILE}.{}.tmp", std::process::id()));
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)?;
                f.write_all(&k)?;
                f.sync_all()?;
                fs::rename(&tmp, &key_path)?;
                k
            }
        };
        Ok(DiskCache {
            dir: dir.to_owned(),
            key,
            fingerprint,
        })
    }

    fn paths(&self, digest_hex: &str) -> (PathBuf, PathBuf) {
        let name = hex::encode(
            Sha256::new()
                .chain_update(digest_hex)
                .chain_update(self.fingerprint)
                .finalize(),
        );
        (
            self.dir.join(format!("{name}.cwasm")),
            self.dir.join(format!("{name}.mac")),
        )
    }

    /// The compiled bytes for `digest_hex`, only if their MAC verifies. A damaged or
    /// foreign entry is removed.
    pub(crate) fn get(&self, digest_hex: &str) -> Option<Vec<u8>> {
        let (code, mac) = self.paths(digest_hex);
        let bytes = fs::read(&code).ok()?;
        let tag = fs::read(&mac)
            .ok()
            .and_then(|t| hex::decode(t.trim_ascii()).ok());
        if tag.is_some_and(|t| constant_time_eq(&t, &hmac(&self.key, &bytes))) {
            return Some(bytes);
        }
        tracing::warn!(path = %code.display(), "compiled-plugin cache entry failed its MAC check; removing it");
        self.remove(digest_hex);
        None
    }

    /// Stores compiled bytes (atomically: temp file, then rename; the MAC last).
    pub(crate) fn put(&self, digest_hex: &str, bytes: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let (code, mac) = self.paths(digest_hex);
        for (path, data) in [
            (&code, bytes.to_vec()),
            (&mac, hex::encode(hmac(&self.key, bytes)).into_bytes()),
        ] {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&data)?;
            f.sync_all()?;
            fs::rename(&tmp, path)?;
        }
        Ok(())
    }

    pub(crate) fn remove(&self, digest_hex: &str) {
        let (code, mac) = self.paths(digest_hex);
        let _ = fs::remove_file(mac);
        let _ = fs::remove_file(code);
    }

    /// Path of the compiled entry for `digest_hex` (for tests that tamper with it).
    #[cfg(test)]
    pub(crate) fn entry_path(&self, digest_hex: &str) -> PathBuf {
        self.paths(digest_hex).0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc4231_case_2_shape() {
        // RFC 4231 test case 2 uses a 4-byte key; ours is zero-padded the same way HMAC
        // pads short keys, so the result must match.
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(b"Jefe");
        assert_eq!(
            hex::encode(hmac(&key, b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn entries_round_trip_and_tampered_ones_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::open(dir.path(), [7; 32]).unwrap();
        cache.put("abc", b"compiled").unwrap();
        assert_eq!(cache.get("abc").as_deref(), Some(&b"compiled"[..]));
        // Another fingerprint (other engine) does not see it.
        let other = DiskCache::open(dir.path(), [8; 32]).unwrap();
        assert_eq!(other.get("abc"), None);
        // Replacing the code without the key fails the MAC and removes the entry.
        std::fs::write(cache.entry_path("abc"), b"evil").unwrap();
        assert_eq!(cache.get("abc"), None);
        assert!(!cache.entry_path("abc").exists());
    }
}
