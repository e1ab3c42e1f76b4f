//! The signed statement: the exact bytes every signature covers.
//!
//! A signature over the digest alone would let a signer's approval of plugin `a 1.0.0`
//! be replayed for the same bytes published under another name or version, so the
//! statement binds all three. Its layout is fixed and line-based, so that other tools
//! (`cosign sign-blob`, `openssl`) can sign the file `kubectl bosun plugin statement`
//! prints, and a person can read what they are signing:
//!
//! ```text
//! bosun.dev/plugin-signature/v1
//! name: <name>
//! version: <version>
//! sha256: <64 lowercase hex digits>
//! ```
//!
//! Every line ends with `\n`; there is nothing else (no trailing blank line, no `\r`).

use std::fmt;

use crate::{Digest, TrustError};

/// The first line of a v1 statement.
pub const STATEMENT_HEADER: &str = "bosun.dev/plugin-signature/v1";

/// A validated (name, version, digest) triple and its canonical bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Statement {
    name: String,
    version: String,
    digest: Digest,
}

impl Statement {
    /// Builds a statement after validating the name (lowercase DNS label) and the version
    /// (semantic version). Validation also guarantees neither can contain a newline, so
    /// the encoding is unambiguous.
    ///
    /// # Errors
    /// [`TrustError::InvalidName`] or [`TrustError::InvalidVersion`].
    pub fn new(
        name: impl Into<String>,
        version: impl Into<String>,
        digest: Digest,
    ) -> Result<Self, TrustError> {
        let name = name.into();
        let version = version.into();
        validate_name(&name)?;
        validate_version(&version)?;
        Ok(Statement {
            name,
            version,
            digest,
        })
    }

    /// The plugin name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The plugin version, exactly as given.
    #[must_use]
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The pinned digest.
    #[must_use]
    pub fn digest(&self) -> &Digest {
        &self.digest
    }

    /// The exact bytes that signatures cover.
    #[must_use]
    pub fn to_bytes(&self) -> Vec<u8> {
        self.to_string().into_bytes()
    }

    /// Parses statement bytes, accepting only the exact canonical encoding: parsing and
    /// re-encoding gives back the same bytes.
    ///
    /// # Errors
    /// [`TrustError::MalformedStatement`] naming the first line that is wrong, or the
    /// name/version/digest errors.
    pub fn parse(bytes: &[u8]) -> Result<Self, TrustError> {
        let malformed = |reason: String| TrustError::MalformedStatement { reason };
        let text =
            std::str::from_utf8(bytes).map_err(|e| malformed(format!("not UTF-8 text: {e}")))?;
        let body = text
            .strip_suffix('\n')
            .ok_or_else(|| malformed("the last line does not end with a newline".into()))?;
        let lines: Vec<&str> = body.split('\n').collect();
        if lines.len() != 4 {
            return Err(malformed(format!("found {} lines, need 4", lines.len())));
        }
        if lines[0] != STATEMENT_HEADER {
            return Err(malformed(format!(
                "line 1 is {:?}, need {STATEMENT_HEADER:?}",
                lines[0]
            )));
        }
        let field = |n: usize, key: &str| -> Result<&str, TrustError> {
            lines[n]
                .strip_prefix(key)
                .and_then(|rest| rest.strip_prefix(": "))
                .ok_or_else(|| {
                    malformed(format!(
                        "line {} is {:?}, need \"{key}: ...\"",
                        n + 1,
                        lines[n]
                    ))
                })
        };
        let name = field(1, "name")?;
        let version = field(2, "version")?;
        let hex_digest = field(3, "sha256")?;
        // Only the canonical lowercase bare hex form is part of the encoding.
        if hex_digest.len() != 64
            || !hex_digest
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(malformed(format!(
                "line 4 has {hex_digest:?}, need 64 lowercase hex digits"
            )));
        }
        Statement::new(name, version, Digest::parse(hex_digest)?)
    }
}

impl fmt::Display for Statement {
    /// Writes the canonical statement text (the signed bytes).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{STATEMENT_HEADER}\nname: {}\nversion: {}\nsha256: {}\n",
            self.name,
            self.version,
            self.digest.to_hex()
        )
    }
}

/// Checks that `name` is a lowercase RFC 1123 DNS label.
///
/// # Errors
/// [`TrustError::InvalidName`] saying which rule is broken.
pub fn validate_name(name: &str) -> Result<(), TrustError> {
    let invalid = |reason: String| TrustError::InvalidName {
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(invalid("it is empty".into()));
    }
    if name.len() > 63 {
        return Err(invalid(format!("it has {} characters", name.len())));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(invalid(format!("character {c:?} is not allowed")));
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err(invalid("it starts or ends with '-'".into()));
    }
    Ok(())
}

/// Checks that `version` is a semantic version (SemVer 2.0.0).
///
/// # Errors
/// [`TrustError::InvalidVersion`] with the parser's explanation.
pub fn validate_version(version: &str) -> Result<(), TrustError> {
    semver::Version::parse(version)
        .map(|_| ())
        .map_err(|e| TrustError::InvalidVersion {
            version: version.to_owned(),
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Statement {
        Statement::new("kubeadm-upgrade", "1.2.3-rc.1+build.5", Digest::of(b"abc")).unwrap()
    }

    #[test]
    fn exact_bytes() {
        assert_eq!(
            sample().to_bytes(),
            b"bosun.dev/plugin-signature/v1\nname: kubeadm-upgrade\nversion: 1.2.3-rc.1+build.5\n\
sha256: ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad\n"
        );
    }

    #[test]
    fn parse_round_trips() {
        let s = sample();
        assert_eq!(Statement::parse(&s.to_bytes()).unwrap(), s);
    }

    #[test]
    fn parse_refuses_non_canonical_encodings() {
        let good = String::from_utf8(sample().to_bytes()).unwrap();
        let bad = [
            good.trim_end().to_owned(),                         // no final newline
            format!("{good}\n"),                                // trailing blank line
            good.replace('\n', "\r\n"),                         // CRLF
            good.replace("name: ", "name:  "),                  // extra space -> bad name
            good.replace("v1", "v2"),                           // other version of the format
            good.replace("ba7816bf", "BA7816BF"),               // upper-case hex
            good.replace("sha256: ", "sha256: sha256:"),        // prefixed digest
            good.replace("kubeadm-upgrade", "Kubeadm-Upgrade"), // invalid name
        ];
        for text in bad {
            assert!(
                Statement::parse(text.as_bytes()).is_err(),
                "accepted {text:?}"
            );
        }
    }

    #[test]
    fn names_are_lowercase_dns_labels() {
        for ok in [
            "a",
            "hello",
            "kubeadm-upgrade",
            "pkg2",
            "0abc",
            &"a".repeat(63),
        ] {
            validate_name(ok).unwrap();
        }
        for bad in [
            "",
            "-a",
            "a-",
            "Hello",
            "a_b",
            "a.b",
            "a\nname: b",
            &"a".repeat(64),
        ] {
            let err = validate_name(bad).unwrap_err();
            assert!(matches!(err, TrustError::InvalidName { .. }), "{bad:?}");
        }
    }

    #[test]
    fn versions_are_semver() {
        for ok in ["0.1.0", "1.2.3-alpha.1", "1.0.0+20260101"] {
            validate_version(ok).unwrap();
        }
        for bad in ["", "1", "1.2", "v1.2.3", "01.2.3", "1.2.3\n", "1.2.3 "] {
            let err = validate_version(bad).unwrap_err();
            assert!(err.to_string().contains("semantic version"), "{err}");
        }
    }
}
