//! SHA-256 digests: the pin that says which exact bytes a Plugin resource means.

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

use crate::TrustError;

const PREFIX: &str = "sha256:";

/// A SHA-256 digest of a plugin's bytes.
///
/// Its canonical text form, used by [`fmt::Display`], [`Digest::parse`] and serde, is
/// `sha256:` followed by 64 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

impl Digest {
    /// Hashes a byte slice.
    #[must_use]
    pub fn of(bytes: &[u8]) -> Self {
        Digest(Sha256::digest(bytes).into())
    }

    /// Hashes everything a reader yields, in 64 KiB chunks, without buffering it all.
    ///
    /// # Errors
    /// Whatever the reader returns (other than `Interrupted`, which is retried).
    pub fn from_reader(mut reader: impl Read) -> io::Result<Self> {
        let mut hasher = Hasher::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match reader.read(&mut buf) {
                Ok(0) => return Ok(hasher.finish()),
                Ok(n) => hasher.update(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Hashes a file by streaming it.
    ///
    /// # Errors
    /// [`TrustError::Io`] naming the file when it cannot be opened or read.
    pub fn of_file(path: impl AsRef<Path>) -> Result<Self, TrustError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| TrustError::io("opening", path, e))?;
        Digest::from_reader(file).map_err(|e| TrustError::io("reading", path, e))
    }

    /// Parses `sha256:<64 hex digits>`. A bare 64-digit hex string (as `sha256sum` prints
    /// it) is accepted too, since it is unambiguous; upper-case hex is accepted and
    /// normalised to lower case.
    ///
    /// # Errors
    /// [`TrustError::MalformedDigest`] saying what is wrong with the input.
    pub fn parse(input: &str) -> Result<Self, TrustError> {
        let malformed = |reason: String| TrustError::MalformedDigest {
            input: input.to_owned(),
            reason,
        };
        let hex_part = if let Some(rest) = input.strip_prefix(PREFIX) {
            rest
        } else if let Some((algorithm, _)) = input.split_once(':') {
            return Err(malformed(format!(
                "algorithm {algorithm:?} is not supported, only sha256"
            )));
        } else {
            input
        };
        if hex_part.len() != 64 {
            return Err(malformed(format!(
                "found {} hex characters, need 64",
                hex_part.len()
            )));
        }
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut bytes)
            .map_err(|e| malformed(format!("not hex: {e}")))?;
        Ok(Digest(bytes))
    }

    /// Wraps raw digest bytes.
    #[must_use]
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Digest(bytes)
    }

    /// The raw 32 digest bytes.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The 64 lowercase hex digits, without the `sha256:` prefix.
    #[must_use]
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}", self.to_hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

impl FromStr for Digest {
    type Err = TrustError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Digest::parse(s)
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Digest::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Incremental SHA-256, for callers that see the bytes in pieces (downloads, copies).
/// It is also an [`io::Write`], so `io::copy(&mut reader, &mut hasher)` works.
#[derive(Clone, Default)]
pub struct Hasher(Sha256);

impl Hasher {
    /// A hasher that has seen no bytes.
    #[must_use]
    pub fn new() -> Self {
        Hasher(Sha256::new())
    }

    /// Feeds more bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// The digest of everything fed so far.
    #[must_use]
    pub fn finish(self) -> Digest {
        Digest(self.0.finalize().into())
    }
}

impl fmt::Debug for Hasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Hasher")
    }
}

impl Write for Hasher {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // sha256("abc") from FIPS 180-2, appendix B.1.
    const ABC: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";

    #[test]
    fn known_answer_and_display() {
        let d = Digest::of(b"abc");
        assert_eq!(d.to_hex(), ABC);
        assert_eq!(d.to_string(), format!("sha256:{ABC}"));
    }

    #[test]
    fn streaming_equals_one_shot() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let streamed = Digest::from_reader(&data[..]).unwrap();
        assert_eq!(streamed, Digest::of(&data));
        let mut h = Hasher::new();
        for chunk in data.chunks(777) {
            h.update(chunk);
        }
        assert_eq!(h.finish(), Digest::of(&data));
    }

    #[test]
    fn of_file_streams_and_names_missing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.wasm");
        std::fs::write(&path, b"abc").unwrap();
        assert_eq!(Digest::of_file(&path).unwrap().to_hex(), ABC);
        let err = Digest::of_file(dir.path().join("missing.wasm")).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("opening ") && msg.contains("missing.wasm"),
            "{msg}"
        );
        // The OS error is in the message once, and not repeated as a source.
        assert_eq!(msg.matches("os error 2").count(), 1, "{msg}");
        assert!(std::error::Error::source(&err).is_none());
    }

    #[test]
    fn parse_accepts_canonical_bare_and_uppercase() {
        let d = Digest::of(b"abc");
        assert_eq!(Digest::parse(&format!("sha256:{ABC}")).unwrap(), d);
        assert_eq!(Digest::parse(ABC).unwrap(), d);
        assert_eq!(Digest::parse(&ABC.to_uppercase()).unwrap(), d);
    }

    #[test]
    fn parse_errors_say_what_is_wrong() {
        let cases = [
            (format!("sha512:{ABC}"), "only sha256"),
            ("sha256:abcd".to_owned(), "found 4 hex characters"),
            (format!("sha256:{}zz", &ABC[..62]), "not hex"),
            (String::new(), "found 0 hex characters"),
        ];
        for (input, want) in cases {
            let err = Digest::parse(&input).unwrap_err();
            assert!(matches!(err, TrustError::MalformedDigest { .. }));
            let msg = err.to_string();
            assert!(msg.contains(want), "{input:?}: {msg}");
            assert!(
                msg.contains("expected `sha256:` followed by 64 hex digits"),
                "{msg}"
            );
        }
    }

    #[test]
    fn serde_round_trips() {
        let d = Digest::of(b"abc");
        let json = serde_json::to_string(&d).unwrap();
        assert_eq!(json, format!("\"sha256:{ABC}\""));
        assert_eq!(serde_json::from_str::<Digest>(&json).unwrap(), d);
        assert!(serde_json::from_str::<Digest>("\"sha256:00\"").is_err());
        let bare = format!("\"{ABC}\"");
        assert_eq!(serde_json::from_str::<Digest>(&bare).unwrap(), d);
    }
}
