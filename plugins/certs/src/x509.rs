//! Reading certificates inside the plugin: PEM files and kubeconfig client certificates,
//! parsed with `x509-parser` (pure Rust, compiled into the component), reduced to what
//! the report needs.

use base64::Engine as _;
use x509_parser::extensions::GeneralName;
use x509_parser::pem::Pem;

/// What the plugin reports about one certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    /// Subject, as `CN=...,O=...`.
    pub subject: String,
    /// Issuer, same spelling.
    pub issuer: String,
    /// NotAfter, seconds since the Unix epoch.
    pub not_after: i64,
    /// NotBefore, seconds since the Unix epoch.
    pub not_before: i64,
    /// Subject alternative names (DNS names and IP addresses), sorted.
    pub sans: Vec<String>,
    /// Serial number, hex.
    pub serial: String,
}

/// Why a certificate could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    #[error("no PEM block found (expected `-----BEGIN CERTIFICATE-----`)")]
    NoPem,
    #[error("the PEM block is not a valid X.509 certificate: {0}")]
    BadCertificate(String),
    #[error("the kubeconfig is not valid YAML: {0}")]
    BadKubeconfig(String),
    #[error(
        "the kubeconfig has no user with `client-certificate-data` or `client-certificate` \
         (expected a kubeadm-written kubeconfig with an embedded client certificate)"
    )]
    NoClientCertificate,
    #[error("`client-certificate-data` is not base64: {0}")]
    BadBase64(String),
}

/// Parses the first certificate of a PEM document.
///
/// # Errors
/// [`ParseError::NoPem`] or [`ParseError::BadCertificate`].
pub fn parse_pem(pem: &[u8]) -> Result<CertInfo, ParseError> {
    let block = Pem::iter_from_buffer(pem)
        .next()
        .ok_or(ParseError::NoPem)?
        .map_err(|_| ParseError::NoPem)?;
    let cert = block
        .parse_x509()
        .map_err(|e| ParseError::BadCertificate(e.to_string()))?;
    let mut sans = Vec::new();
    if let Ok(Some(ext)) = cert.subject_alternative_name() {
        for name in &ext.value.general_names {
            match name {
                GeneralName::DNSName(d) => sans.push(format!("DNS:{d}")),
                GeneralName::IPAddress(ip) => sans.push(format!("IP:{}", format_ip(ip))),
                _ => {}
            }
        }
    }
    sans.sort();
    Ok(CertInfo {
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        not_after: cert.validity().not_after.timestamp(),
        not_before: cert.validity().not_before.timestamp(),
        sans,
        serial: cert.raw_serial_as_string(),
    })
}

fn format_ip(bytes: &[u8]) -> String {
    match bytes.len() {
        4 => format!("{}.{}.{}.{}", bytes[0], bytes[1], bytes[2], bytes[3]),
        16 => bytes
            .chunks(2)
            .map(|p| format!("{:x}", u16::from_be_bytes([p[0], p[1]])))
            .collect::<Vec<_>>()
            .join(":"),
        _ => hex_string(bytes),
    }
}

fn hex_string(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Where a kubeconfig keeps its client certificate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientCert {
    /// Embedded (`client-certificate-data`), decoded PEM.
    Embedded(Vec<u8>),
    /// A file path (`client-certificate`), as kubelet.conf does after the kubelet's own
    /// certificate rotation (`/var/lib/kubelet/pki/kubelet-client-current.pem`).
    File(String),
}

/// The client certificate of the first user of a kubeconfig.
///
/// # Errors
/// [`ParseError::BadKubeconfig`], [`ParseError::NoClientCertificate`], [`ParseError::BadBase64`].
pub fn kubeconfig_client_cert(yaml: &str) -> Result<ClientCert, ParseError> {
    let doc: serde_yaml::Value =
        serde_yaml::from_str(yaml).map_err(|e| ParseError::BadKubeconfig(e.to_string()))?;
    let users = doc
        .get("users")
        .and_then(serde_yaml::Value::as_sequence)
        .ok_or(ParseError::NoClientCertificate)?;
    for user in users {
        let Some(u) = user.get("user") else { continue };
        if let Some(data) = u
            .get("client-certificate-data")
            .and_then(serde_yaml::Value::as_str)
        {
            let pem = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|e| ParseError::BadBase64(e.to_string()))?;
            return Ok(ClientCert::Embedded(pem));
        }
        if let Some(path) = u
            .get("client-certificate")
            .and_then(serde_yaml::Value::as_str)
        {
            return Ok(ClientCert::File(path.to_owned()));
        }
    }
    Err(ParseError::NoClientCertificate)
}

/// Seconds since the epoch as RFC 3339 UTC (`2027-11-30T02:35:12Z`).
#[must_use]
pub fn rfc3339(ts: i64) -> String {
    let days = ts.div_euclid(86_400);
    let secs = ts.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// Parses RFC 3339 UTC as [`rfc3339`] writes it (`2027-11-30T02:35:12Z`, optionally with a
/// fraction of a second, which is dropped) into seconds since the epoch.
///
/// # Errors
/// A message naming the form expected.
pub fn parse_rfc3339(text: &str) -> Result<i64, String> {
    let bad = || format!("`{text}` is not a UTC time such as `2026-12-06T15:04:05Z`");
    let body = text.strip_suffix('Z').ok_or_else(bad)?;
    let body = body.split_once('.').map_or(body, |(whole, fraction)| {
        if !fraction.is_empty() && fraction.bytes().all(|b| b.is_ascii_digit()) {
            whole
        } else {
            "invalid"
        }
    });
    let b = body.as_bytes();
    let shape_ok = b.len() == 19
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            _ => c.is_ascii_digit(),
        });
    if !shape_ok {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| body[r].parse::<i64>().map_err(|_| bad());
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let days = days_from_civil(y, m, d);
    if !(1..=12).contains(&m) || civil_from_days(days) != (y, m as u32, d as u32) {
        return Err(bad());
    }
    if hh > 23 || mm > 59 || ss > 60 {
        return Err(bad());
    }
    Ok(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// A proleptic Gregorian (year, month, day) to days since 1970-01-01: the inverse of
/// [`civil_from_days`] (the same algorithm, the other way).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day). Howard Hinnant's
/// well-known algorithm, written out here to avoid a date crate in the component.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let m = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Parses a Go-style duration of hours, minutes and seconds (`720h`, `90h30m`, `45s`) into
/// seconds, as the Operation API spells `renewBefore`.
///
/// # Errors
/// A message naming what was expected when the text is not of that form.
pub fn parse_duration(text: &str) -> Result<i64, String> {
    let bad = || {
        format!(
            "`{text}` is not a duration of hours, minutes and seconds such as `720h` or `90h30m`"
        )
    };
    if text.is_empty() {
        return Err(bad());
    }
    let mut total: i64 = 0;
    let mut number = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return Err(bad()),
        };
        let n: i64 = number.parse().map_err(|_| bad())?;
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(bad)?;
        number.clear();
    }
    if number.is_empty() {
        Ok(total)
    } else {
        Err(bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_parses_back_what_it_writes_and_refuses_other_shapes() {
        for ts in [0, 951_782_400, 1_796_956_512, 4_102_444_799, -86_400] {
            assert_eq!(parse_rfc3339(&rfc3339(ts)), Ok(ts), "{}", rfc3339(ts));
        }
        assert_eq!(
            parse_rfc3339("2026-12-06T15:04:05.123456Z"),
            Ok(1_796_569_445)
        );
        for bad in [
            "",
            "2026-12-06T15:04:05",
            "2026-12-06T15:04:05+01:00",
            "2026-12-06 15:04:05Z",
            "2026-02-30T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-12-06T24:00:00Z",
            "2026-12-06T15:04:05.Z",
            "2026-12-06T15:04:05.1xZ",
            "+026-12-06T15:04:05Z",
        ] {
            assert!(parse_rfc3339(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_827_542_100), "2027-11-30T02:35:00Z");
    }

    #[test]
    fn durations_parse_like_the_api_spells_them() {
        assert_eq!(parse_duration("720h"), Ok(720 * 3600));
        assert_eq!(parse_duration("90h30m"), Ok(90 * 3600 + 30 * 60));
        assert_eq!(parse_duration("45s"), Ok(45));
        assert!(parse_duration("30d").unwrap_err().contains("`30d`"));
        assert!(parse_duration("12").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn kubeconfig_client_cert_embedded_or_file() {
        let embedded = "users:\n- name: a\n  user:\n    client-certificate-data: aGVsbG8=\n";
        assert_eq!(
            kubeconfig_client_cert(embedded),
            Ok(ClientCert::Embedded(b"hello".to_vec()))
        );
        let file = "users:\n- name: a\n  user:\n    client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem\n";
        assert_eq!(
            kubeconfig_client_cert(file),
            Ok(ClientCert::File(
                "/var/lib/kubelet/pki/kubelet-client-current.pem".into()
            ))
        );
        assert_eq!(
            kubeconfig_client_cert("users: []\n"),
            Err(ParseError::NoClientCertificate)
        );
    }

    #[test]
    fn garbage_is_not_a_certificate() {
        assert_eq!(parse_pem(b"not pem"), Err(ParseError::NoPem));
    }
}
