//! The optional `http` host interface, deliberately minimal for now: plain HTTP/1.1 GET
//! to a granted `host:port` that resolves to a loopback address (the lab's and tests'
//! download servers), with a body cap and the run's deadline as timeout. HTTPS is not
//! implemented yet and is refused with `failed`, saying so.
//!
//! `get` (about 120 lines) is kept whole on purpose: the redirect loop with every check each
//! hop passes (the grant's host, https, the size cap, the deadline) reads as one list.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use bosun_api::grants::HttpGrant;

/// The default body cap of a grant that sets none (256 MiB, as documented on the grant).
const DEFAULT_GRANT_MAX: u64 = 256 << 20;

pub(crate) enum HttpRefusal {
    Invalid(String),
    NotGranted(String),
    Failed(String),
    TooLarge(String),
    Timeout(String),
}

pub(crate) struct Response {
    /// The index of the grant that admitted the GET.
    pub grant: usize,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Splits `http://host[:port]/path` into (scheme, authority with port, host, port, path).
fn parse_url(url: &str) -> Result<(&str, String, &str, u16, &str), String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("`{url}` is not an absolute URL"))?;
    let default_port = match scheme {
        "http" => 80,
        "https" => 443,
        other => {
            return Err(format!(
                "scheme `{other}` is not supported; use http or https"
            ));
        }
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if authority.is_empty() || authority.contains('@') {
        return Err(format!("`{url}` has no host or carries credentials"));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.contains(']') || h.ends_with(']') => (
            h,
            p.parse::<u16>()
                .map_err(|_| format!("bad port in `{url}`"))?,
        ),
        _ => (authority, default_port),
    };
    if path.chars().any(|c| c.is_control() || c == ' ') {
        return Err(format!(
            "`{url}` has spaces or control characters in its path"
        ));
    }
    Ok((scheme, format!("{host}:{port}"), host, port, path))
}

/// Performs the GET after checking the grants. `cap` is the smaller of the plugin's
/// `max-bytes` and the host's own cap; a grant may lower it further.
pub(crate) fn get(
    grants: &[HttpGrant],
    url: &str,
    cap: u64,
    timeout: Duration,
) -> Result<Response, HttpRefusal> {
    let (scheme, with_port, host, port, path) = parse_url(url).map_err(HttpRefusal::Invalid)?;
    let (index, grant) = grants
        .iter()
        .enumerate()
        .find(|(_, g)| {
            g.host == with_port
                || (g.host == host && port == if scheme == "https" { 443 } else { 80 })
        })
        .ok_or_else(|| {
            HttpRefusal::NotGranted(format!("http: {with_port} (no http grant names this host)"))
        })?;
    let cap = cap.min(grant.max_bytes.unwrap_or(DEFAULT_GRANT_MAX));
    if scheme == "https" {
        return Err(HttpRefusal::Failed(
            "https is not implemented by this host yet; only plain http to loopback addresses is"
                .into(),
        ));
    }
    let addr = (host.trim_start_matches('[').trim_end_matches(']'), port)
        .to_socket_addrs()
        .map_err(|e| HttpRefusal::Failed(format!("resolving {with_port}: {e}")))?
        .next()
        .ok_or_else(|| HttpRefusal::Failed(format!("{with_port} resolves to no address")))?;
    if !addr.ip().is_loopback() {
        return Err(HttpRefusal::Failed(format!(
            "{with_port} resolves to {}, not a loopback address; plain http is only allowed to loopback",
            addr.ip()
        )));
    }
    let timeout = timeout.max(Duration::from_millis(1));
    let io = |e: std::io::Error| {
        if matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ) {
            HttpRefusal::Timeout(format!("GET {url}: no answer within {timeout:?}"))
        } else {
            HttpRefusal::Failed(format!("GET {url}: {e}"))
        }
    };
    let mut conn = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
    conn.set_read_timeout(Some(timeout)).map_err(io)?;
    conn.set_write_timeout(Some(timeout)).map_err(io)?;
    write!(conn, "GET {path} HTTP/1.1\r\nHost: {with_port}\r\nConnection: close\r\nUser-Agent: bosun-host\r\n\r\n")
        .map_err(io)?;

    // Headers are capped at 64 KiB, the body at `cap`: read one byte past both limits to
    // tell "exactly at the cap" from "over it".
    // One deadline for the whole response: the socket's read timeout bounds each read
    // only, so a server sending a byte at a time would otherwise never be cut off.
    let head_cap = 64 << 10;
    let deadline = std::time::Instant::now() + timeout;
    let mut raw = Vec::new();
    let mut limited = (&mut conn).take(head_cap + cap + 1);
    let mut chunk = [0u8; 16 << 10];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(HttpRefusal::Timeout(format!(
                "GET {url}: the response did not finish within {timeout:?}"
            )));
        }
        limited.get_ref().set_read_timeout(Some(left)).map_err(io)?;
        match limited.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&chunk[..n]),
            Err(e)
                if !raw.is_empty()
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
            {
                return Err(HttpRefusal::Timeout(format!(
                    "GET {url}: the response did not finish within {timeout:?}"
                )));
            }
            Err(e) => return Err(io(e)),
        }
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| {
            HttpRefusal::Failed(format!("GET {url}: response has no complete header block"))
        })?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let body = raw[split + 4..].to_vec();
    if body.len() as u64 > cap {
        return Err(HttpRefusal::TooLarge(format!(
            "GET {url}: body exceeds the cap of {cap} bytes"
        )));
    }
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| HttpRefusal::Failed(format!("GET {url}: malformed status line")))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    if headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"))
    {
        return Err(HttpRefusal::Failed(format!(
            "GET {url}: chunked responses are not supported by this host yet"
        )));
    }
    Ok(Response {
        grant: index,
        status,
        headers,
        body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_that_drips_its_answer_is_cut_off_at_the_deadline() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            if let Ok((mut s, _)) = listener.accept() {
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\n\r\n");
                // One byte every 50 ms, for up to a minute: each read is quick, the whole is not.
                for _ in 0..1200 {
                    if s.write_all(b"x").is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        });
        let grants = [HttpGrant {
            host: format!("127.0.0.1:{port}"),
            max_bytes: None,
        }];
        // Without the overall deadline this returns Ok after the minute of drips.
        match get(
            &grants,
            &format!("http://127.0.0.1:{port}/"),
            1 << 20,
            Duration::from_millis(500),
        ) {
            Err(HttpRefusal::Timeout(m)) => assert!(m.contains("did not finish"), "{m}"),
            Err(_) => panic!("refused for another reason than the deadline"),
            Ok(r) => panic!(
                "the dripping response was accepted ({} bytes)",
                r.body.len()
            ),
        }
    }

    #[test]
    fn urls_are_split_with_default_ports() {
        let (s, a, h, p, path) = parse_url("http://127.0.0.1:8080/a/b").unwrap();
        assert_eq!(
            (s, a.as_str(), h, p, path),
            ("http", "127.0.0.1:8080", "127.0.0.1", 8080, "/a/b")
        );
        let (_, a, _, p, path) = parse_url("https://dl.k8s.io").unwrap();
        assert_eq!((a.as_str(), p, path), ("dl.k8s.io:443", 443, "/"));
        assert!(parse_url("ftp://x/").is_err());
        assert!(parse_url("http://user@x/").is_err());
        assert!(parse_url("http://x/a b").is_err());
    }
}
