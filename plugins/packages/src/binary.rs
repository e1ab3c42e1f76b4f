//! The binary backend: a program downloaded from a granted URL, checked against a SHA-256
//! digest, and put in place atomically, with the previous file kept for `rollback`.
//!
//! Steps for `/usr/bin/NAME`, all in the same directory so every rename is atomic:
//! 1. download into memory (the host caps the size), check the declared length (a cut
//!    connection is caught here) and the digest: nothing on disk has changed yet;
//! 2. write `.NAME.bosun-new` and make it executable (`chmod 0755` through the exec grant:
//!    WASI has no permission bits);
//! 3. hard-link the current file to `.NAME.bosun-prev` (replacing an older one);
//! 4. rename `.NAME.bosun-new` over `NAME`.
//!
//! Any failure before step 4 leaves `NAME` as it was. A file already matching the digest is
//! left alone (idempotent).

use std::io::ErrorKind;

use bosun_plugin_sdk::exec::Command;
use bosun_plugin_sdk::prelude::*;
use sha2::{Digest as _, Sha256};

/// `chmod`, granted only as `chmod 0755 DIR/.NAME.bosun-new`.
pub const CHMOD: &str = "/usr/bin/chmod";
/// Where binaries go unless a path is given (where kubeadm packages put them).
pub const DEFAULT_DIR: &str = "/usr/bin";
/// Default source of Kubernetes binaries: `{base}/{version}/bin/linux/{arch}/{name}`, with
/// the digest at the same URL plus `.sha256`.
pub const DEFAULT_BASE_URL: &str = "https://dl.k8s.io/release";
/// Largest binary accepted (kubelet is ~80 MiB).
pub const MAX_BYTES: u64 = 256 << 20;

/// One binary to install.
#[derive(Clone, Debug, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BinarySpec {
    /// File name, for example `kubeadm`.
    pub name: String,
    /// Where to download it from; its host must be granted (`http` grants).
    pub url: String,
    /// Expected SHA-256, hex. Absent: read from `URL.sha256` (as dl.k8s.io publishes).
    #[serde(default)]
    pub sha256: Option<String>,
    /// Absolute target path. Default `/usr/bin/NAME`.
    #[serde(default)]
    pub path: Option<String>,
}

impl BinarySpec {
    /// The target path.
    #[must_use]
    pub fn target(&self) -> String {
        self.path
            .clone()
            .unwrap_or_else(|| format!("{DEFAULT_DIR}/{}", self.name))
    }
}

/// `DIR/.NAME.SUFFIX` next to `path`.
#[must_use]
pub fn sibling(path: &str, suffix: &str) -> String {
    let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
    format!("{dir}/.{name}.{suffix}")
}

/// Hex SHA-256 of `bytes`.
#[must_use]
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Validates a spec before anything is fetched.
///
/// # Errors
/// `bad-params` naming the field.
pub fn validate(spec: &BinarySpec) -> Result<(), PluginError> {
    let target = spec.target();
    if !target.starts_with('/')
        || target.split('/').any(|c| c == ".." || c == ".")
        || target.ends_with('/')
    {
        return Err(PluginError::new(
            "bad-params",
            format!(
                "binaries[{}].path: `{target}` is not an absolute file path without . or ..",
                spec.name
            ),
        ));
    }
    if spec.name.is_empty() || spec.name.contains('/') {
        return Err(PluginError::new(
            "bad-params",
            format!("binaries: name `{}` is not a file name", spec.name),
        ));
    }
    if let Some(d) = &spec.sha256
        && (d.len() != 64 || !d.chars().all(|c| c.is_ascii_hexdigit()))
    {
        return Err(PluginError::new(
            "bad-params",
            format!(
                "binaries[{}].sha256: expected 64 hex digits, found `{d}`",
                spec.name
            ),
        ));
    }
    Ok(())
}

/// Redirects followed per download.
const MAX_REDIRECTS: usize = 5;

/// GETs `url`, following up to [`MAX_REDIRECTS`] redirects, and checks the status and,
/// when the server declared one, the length. The host follows no redirect itself: each hop
/// is a GET of its own, admitted only if an `http` grant names its host, and a redirect
/// from https to plain http is refused here.
fn download(url: &str, max: u64) -> Result<Vec<u8>, PluginError> {
    let mut at = url.to_owned();
    for hop in 0..=MAX_REDIRECTS {
        let r = bosun_plugin_sdk::http::get(&at, max).map_err(|e| {
            let retryable = matches!(e, HostError::Timeout(_) | HostError::Failed(_));
            let not_granted = matches!(e, HostError::NotGranted(_));
            let mut pe = PluginError::from(e);
            pe.retryable = retryable;
            if hop > 0 && not_granted {
                pe.context(format!(
                    "downloading {url}, which redirected to {at}: grant that host (an `http` grant), or set the URL to it"
                ))
            } else {
                pe.context(format!("downloading {at}"))
            }
        })?;
        if matches!(r.status, 301 | 302 | 303 | 307 | 308) {
            let location = r
                .headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("location"))
                .map(|(_, v)| v.trim().to_owned())
                .ok_or_else(|| {
                    PluginError::retryable(
                        "download-failed",
                        format!("GET {at}: HTTP {} without a Location", r.status),
                    )
                })?;
            at = redirect_target(&at, &location)?;
            continue;
        }
        if r.status != 200 {
            return Err(PluginError::retryable(
                "download-failed",
                format!("GET {at}: HTTP {}, expected 200", r.status),
            ));
        }
        let declared = r
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse::<u64>().ok());
        if let Some(len) = declared
            && len != r.body.len() as u64
        {
            return Err(PluginError::retryable(
                "download-incomplete",
                format!(
                    "GET {at}: received {} of the {len} bytes the server announced (connection cut?); nothing was changed, retry",
                    r.body.len()
                ),
            ));
        }
        return Ok(r.body);
    }
    Err(PluginError::new(
        "download-failed",
        format!("GET {url}: more than {MAX_REDIRECTS} redirects"),
    ))
}

/// Where a redirect from `from` to `location` leads: an absolute http(s) URL, or a path
/// on the same scheme and host. Never from https to http.
fn redirect_target(from: &str, location: &str) -> Result<String, PluginError> {
    let refuse = |why: &str| {
        PluginError::new(
            "download-failed",
            format!("GET {from}: redirected to `{location}`, {why}"),
        )
    };
    let target = if location.starts_with("https://") || location.starts_with("http://") {
        location.to_owned()
    } else if location.starts_with('/') && !location.starts_with("//") {
        let (scheme, rest) = from.split_once("://").unwrap_or(("https", from));
        let authority = rest.split('/').next().unwrap_or(rest);
        format!("{scheme}://{authority}{location}")
    } else {
        return Err(refuse("which is not an absolute URL or path"));
    };
    if from.starts_with("https://") && !target.starts_with("https://") {
        return Err(refuse("which leaves https: refused"));
    }
    Ok(target)
}

/// The expected digest: given, or the first word of `URL.sha256`.
fn expected_digest(spec: &BinarySpec) -> Result<String, PluginError> {
    if let Some(d) = &spec.sha256 {
        return Ok(d.to_ascii_lowercase());
    }
    let url = format!("{}.sha256", spec.url);
    let body = download(&url, 4096)?;
    let text = String::from_utf8_lossy(&body);
    let d = text
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    if d.len() != 64 || !d.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(PluginError::new(
            "bad-digest-file",
            format!("{url} does not start with a SHA-256 hex digest"),
        ));
    }
    Ok(d)
}

/// What happened to one binary.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// Already the wanted bytes.
    Unchanged,
    /// Would be replaced (dry run).
    WouldReplace,
    /// Replaced; the previous file (if any) is kept at the returned path.
    Replaced { previous: Option<String> },
}

/// Installs one binary (see the module docs).
///
/// # Errors
/// `download-*` (retryable), `digest-mismatch`, file errors; in every case the target is
/// unchanged.
pub fn install(spec: &BinarySpec, dry_run: bool) -> Result<(Change, String), PluginError> {
    validate(spec)?;
    let target = spec.target();
    let want = expected_digest(spec)?;
    let current = match std::fs::read(&target) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        Err(e) => {
            return Err(PluginError::new(
                "file-error",
                format!(
                    "reading {target}: {e}; the plugin needs a ReadWrite grant on its directory"
                ),
            ));
        }
    };
    if current.as_deref().map(sha256_hex).as_deref() == Some(want.as_str()) {
        return Ok((Change::Unchanged, want));
    }
    if dry_run {
        return Ok((Change::WouldReplace, want));
    }
    let bytes = download(&spec.url, MAX_BYTES)?;
    let got = sha256_hex(&bytes);
    if got != want {
        return Err(PluginError::new(
            "digest-mismatch",
            format!(
                "{}: SHA-256 is {got}, expected {want}; {target} was not changed. Check the URL and the digest",
                spec.url
            ),
        ));
    }
    let staged = sibling(&target, "bosun-new");
    let previous = sibling(&target, "bosun-prev");
    std::fs::write(&staged, &bytes).map_err(|e| write_error(&staged, &e))?;
    let chmod = Command::new(CHMOD).args(["0755", staged.as_str()]).run();
    if let Err(e) = chmod {
        let _ = std::fs::remove_file(&staged);
        return Err(PluginError::from(e).context(format!("making {staged} executable")));
    }
    let kept = if current.is_some() {
        match std::fs::remove_file(&previous) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(write_error(&previous, &e)),
        }
        std::fs::hard_link(&target, &previous).map_err(|e| write_error(&previous, &e))?;
        Some(previous)
    } else {
        None
    };
    std::fs::rename(&staged, &target).map_err(|e| write_error(&target, &e))?;
    Ok((Change::Replaced { previous: kept }, want))
}

/// Puts `.NAME.bosun-prev` back as `NAME`.
///
/// # Errors
/// `no-previous` when there is nothing to roll back to.
pub fn rollback(target: &str, dry_run: bool) -> Result<bool, PluginError> {
    let previous = sibling(target, "bosun-prev");
    if std::fs::metadata(&previous).is_err() {
        return Err(PluginError::new(
            "no-previous",
            format!(
                "{previous} does not exist: no earlier install of {target} by this plugin to roll back to"
            ),
        ));
    }
    if dry_run {
        return Ok(false);
    }
    std::fs::rename(&previous, target).map_err(|e| write_error(target, &e))?;
    Ok(true)
}

fn write_error(path: &str, e: &std::io::Error) -> PluginError {
    PluginError::new(
        "file-error",
        format!(
            "writing {path}: {e}; the plugin needs a ReadWrite grant on the directory of the binary"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_stay_on_https_and_resolve_paths_on_the_same_host() {
        let from = "https://dl.k8s.io/release/v1.34.2/bin/linux/amd64/kubeadm";
        assert_eq!(
            redirect_target(from, "https://cdn.example/k").unwrap(),
            "https://cdn.example/k"
        );
        assert_eq!(
            redirect_target(from, "/other/kubeadm").unwrap(),
            "https://dl.k8s.io/other/kubeadm"
        );
        assert_eq!(
            redirect_target("http://127.0.0.1:8080/a", "/b").unwrap(),
            "http://127.0.0.1:8080/b"
        );
        for (location, why) in [
            ("http://dl.k8s.io/k", "which leaves https: refused"),
            ("//evil.example/k", "not an absolute URL or path"),
            ("kubeadm", "not an absolute URL or path"),
            ("ftp://x/k", "not an absolute URL or path"),
        ] {
            let e = redirect_target(from, location).unwrap_err();
            assert!(e.message.contains(why), "{location}: {}", e.message);
        }
    }

    #[test]
    fn siblings_are_hidden_in_the_same_directory() {
        assert_eq!(
            sibling("/usr/bin/kubeadm", "bosun-new"),
            "/usr/bin/.kubeadm.bosun-new"
        );
    }

    #[test]
    fn specs_are_validated() {
        let mut s = BinarySpec {
            name: "kubeadm".into(),
            url: "http://127.0.0.1:1/k".into(),
            sha256: None,
            path: None,
        };
        assert!(validate(&s).is_ok());
        s.path = Some("/usr/bin/../../etc/passwd".into());
        assert!(validate(&s).is_err());
        s.path = None;
        s.sha256 = Some("abc".into());
        assert_eq!(validate(&s).unwrap_err().code, "bad-params");
    }

    #[test]
    fn digest_is_hex_sha256() {
        assert_eq!(
            sha256_hex(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
