//! The optional `http` host interface: HTTP/1.1 GET to a granted `host:port`, with a body
//! cap and the run's deadline as the timeout of the whole exchange.
//!
//! - **https** is verified with rustls against the Mozilla roots compiled into the host
//!   (`webpki-root-certs`) plus the certificate authorities an administrator adds
//!   ([`HttpConfig::ca_certificates`]). Never against a CA bundle on the node: a plugin
//!   with a write grant could have put one there. The server's name is checked, SNI is
//!   sent, and a server that closes without TLS `close_notify` is accepted only when the
//!   body has the length it announced.
//! - **plain http** only to an address on loopback (the lab's and tests' servers): nothing
//!   on the way can be trusted to leave it unchanged.
//! - **Redirects are not followed** by the host: a plugin gets the 3xx and its `Location`,
//!   and a GET there is checked against the grants again like any other.
//!
//! `get` is kept whole on purpose: every check a GET passes (the grant's host, the
//! scheme, the address, the size cap, the deadline) reads as one list. The two transports
//! below it share its reading loop, one socket read per turn, so a server dripping its
//! answer (or its TLS handshake) is cut off at the deadline.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bosun_api::grants::HttpGrant;
use rustls::pki_types::{CertificateDer, ServerName};

/// The default body cap of a grant that sets none (256 MiB, as documented on the grant).
const DEFAULT_GRANT_MAX: u64 = 256 << 20;

/// How the host's GETs are trusted and where their names go; part of
/// [`HostConfig`](crate::HostConfig).
#[derive(Clone, Debug, Default)]
pub struct HttpConfig {
    /// Certificate authorities trusted for https besides the compiled-in Mozilla roots,
    /// DER-encoded: an administrator's mirror behind its own CA (the agent's `--http-ca-file`).
    pub ca_certificates: Vec<CertificateDer<'static>>,
    /// Trust only `ca_certificates`, not the compiled-in roots.
    pub no_web_roots: bool,
    /// Fixed addresses for `host:port`, as curl's `--resolve`: the conformance kit and
    /// tests serve a granted host (`dl.k8s.io:443`) from loopback with this. The grant
    /// check and the certificate's name check are unchanged: they see the URL's host.
    pub resolve: Vec<(String, SocketAddr)>,
}

impl HttpConfig {
    /// Adds every certificate of a PEM bundle to [`HttpConfig::ca_certificates`]; the
    /// number added. A bundle with none, or one that does not parse, is an error naming
    /// `source`.
    pub fn add_ca_pem(&mut self, pem: &[u8], source: &str) -> Result<usize, String> {
        use rustls::pki_types::pem::PemObject as _;
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{source}: not a PEM certificate bundle: {e}"))?;
        if certs.is_empty() {
            return Err(format!("{source}: no CERTIFICATE block in it"));
        }
        let n = certs.len();
        self.ca_certificates.extend(certs);
        Ok(n)
    }

    /// [`HttpConfig::add_ca_pem`] with the bundle read from `path`; errors name `source`
    /// (the flag or kit entry it came from) and the path.
    pub fn add_ca_file(&mut self, path: &std::path::Path, source: &str) -> Result<usize, String> {
        let source = format!("{source} {}", path.display());
        let pem = std::fs::read(path).map_err(|e| format!("reading {source}: {e}"))?;
        self.add_ca_pem(&pem, &source)
    }
}

/// The TLS configuration built once per host from an [`HttpConfig`].
pub(crate) struct Client {
    tls: Arc<rustls::ClientConfig>,
    resolve: Vec<(String, SocketAddr)>,
}

impl Client {
    pub(crate) fn new(config: &HttpConfig) -> Result<Client, String> {
        let mut roots = rustls::RootCertStore::empty();
        if !config.no_web_roots {
            roots.add_parsable_certificates(
                webpki_root_certs::TLS_SERVER_ROOT_CERTS.iter().cloned(),
            );
        }
        for (i, ca) in config.ca_certificates.iter().enumerate() {
            roots.add(ca.clone()).map_err(|e| {
                format!(
                    "http CA certificate {} is not a usable trust anchor: {e}",
                    i + 1
                )
            })?;
        }
        if roots.is_empty() {
            return Err(
                "http: no certificate authority to trust (no_web_roots with no CA certificates)"
                    .into(),
            );
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("http: TLS versions: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Client {
            tls: Arc::new(tls),
            resolve: config.resolve.clone(),
        })
    }

    /// Where `host:port` goes: the fixed address if one is configured, else DNS.
    /// `host` is without an IPv6 literal's brackets.
    fn addresses(&self, with_port: &str, host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        if let Some((_, a)) = self.resolve.iter().find(|(k, _)| k == with_port) {
            return Ok(vec![*a]);
        }
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|e| format!("resolving {with_port}: {e}"))?
            .collect();
        if addrs.is_empty() {
            return Err(format!("{with_port} resolves to no address"));
        }
        Ok(addrs)
    }
}

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
    client: &Client,
    grants: &[HttpGrant],
    url: &str,
    cap: u64,
    timeout: Duration,
) -> Result<Response, HttpRefusal> {
    let (scheme, with_port, host, port, path) = parse_url(url).map_err(HttpRefusal::Invalid)?;
    let https = scheme == "https";
    let default_port = if https { 443 } else { 80 };
    let (index, grant) = grants
        .iter()
        .enumerate()
        .find(|(_, g)| g.host == with_port || (g.host == host && port == default_port))
        .ok_or_else(|| {
            HttpRefusal::NotGranted(format!("http: {with_port} (no http grant names this host)"))
        })?;
    let cap = cap.min(grant.max_bytes.unwrap_or(DEFAULT_GRANT_MAX));
    let bare_host = host.trim_start_matches('[').trim_end_matches(']');
    let server_name = if https {
        Some(ServerName::try_from(bare_host.to_owned()).map_err(|e| {
            HttpRefusal::Invalid(format!("`{host}` is not a server name TLS can check: {e}"))
        })?)
    } else {
        None
    };
    let addrs = client
        .addresses(&with_port, bare_host, port)
        .map_err(HttpRefusal::Failed)?;
    if let Some(a) = addrs.iter().find(|a| !https && !a.ip().is_loopback()) {
        return Err(HttpRefusal::Failed(format!(
            "{with_port} resolves to {}, not a loopback address; plain http is only allowed to loopback: use https",
            a.ip()
        )));
    }
    let timeout = timeout.max(Duration::from_millis(1));
    let deadline = Instant::now() + timeout;
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
    let sock = connect(&addrs, deadline).map_err(io)?;
    let mut conn: Box<dyn Transport> = match server_name {
        Some(name) => {
            let tls = rustls::ClientConnection::new(Arc::clone(&client.tls), name)
                .map_err(|e| HttpRefusal::Failed(format!("GET {url}: TLS: {e}")))?;
            let mut t = Tls { conn: tls, sock };
            t.handshake(deadline).map_err(io)?;
            Box::new(t)
        }
        None => Box::new(Plain(sock)),
    };
    let host_header = if port == default_port {
        host
    } else {
        with_port.as_str()
    };
    until(conn.socket(), deadline).map_err(io)?;
    conn.send(
        format!("GET {path} HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\nAccept-Encoding: identity\r\nUser-Agent: bosun-host\r\n\r\n")
            .as_bytes(),
    )
    .map_err(io)?;

    // Headers are capped at 64 KiB, the body at `cap`: reading stops once more than both
    // together arrived (`cut`). One deadline for the whole response, checked before each
    // socket read: a read timeout bounds one read only, so a server sending a byte at a
    // time would otherwise never be cut off.
    let head_cap: usize = 64 << 10;
    let limit = (head_cap as u64).saturating_add(cap);
    let mut raw = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    let (mut cut, mut clean_end) = (false, true);
    let unfinished = || {
        HttpRefusal::Timeout(format!(
            "GET {url}: the response did not finish within {timeout:?}"
        ))
    };
    loop {
        if until(conn.socket(), deadline).is_err() {
            return Err(unfinished());
        }
        match conn.turn(&mut chunk) {
            Ok(Turn::Data(n)) => {
                raw.extend_from_slice(&chunk[..n]);
                if raw.len() as u64 > limit {
                    cut = true;
                    break;
                }
            }
            Ok(Turn::Progress) => {}
            Ok(Turn::End { clean }) => {
                clean_end = clean;
                break;
            }
            Err(e)
                if !raw.is_empty()
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
            {
                return Err(unfinished());
            }
            Err(e) => return Err(io(e)),
        }
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .filter(|&s| s <= head_cap)
        .ok_or_else(|| {
            HttpRefusal::Failed(format!(
                "GET {url}: the response has no complete header block within 64 KiB"
            ))
        })?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let body = raw[split + 4..].to_vec();
    if cut || body.len() as u64 > cap {
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
    // Without close_notify the end of the connection may be an attacker's cut: the body
    // counts only when it is exactly as long as the server announced.
    let announced = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<u64>().ok());
    if !clean_end && announced != Some(body.len() as u64) {
        return Err(HttpRefusal::Failed(format!(
            "GET {url}: the server ended the TLS connection without close_notify after {} body bytes{}; the body may be cut short, retry",
            body.len(),
            announced.map_or_else(String::new, |n| format!(" of the {n} it announced"))
        )));
    }
    Ok(Response {
        grant: index,
        status,
        headers,
        body,
    })
}

/// Sets the socket's read and write timeouts to what is left until `deadline`; `TimedOut`
/// once nothing is left.
fn until(sock: &TcpStream, deadline: Instant) -> std::io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::ErrorKind::TimedOut.into());
    }
    sock.set_read_timeout(Some(left))?;
    sock.set_write_timeout(Some(left))
}

/// Connects to the first address that answers before the deadline.
fn connect(addrs: &[SocketAddr], deadline: Instant) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address to connect to");
    for a in addrs {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        match TcpStream::connect_timeout(a, left) {
            Ok(s) => return Ok(s),
            Err(e) => last = std::io::Error::new(e.kind(), format!("connecting to {a}: {e}")),
        }
    }
    Err(last)
}

/// What one turn of reading gave.
enum Turn {
    /// Bytes of the response.
    Data(usize),
    /// A socket read that gave no response bytes yet (part of a TLS record).
    Progress,
    /// The end of the response; `clean` is false when TLS ended without close_notify.
    End { clean: bool },
}

/// One connection, plain or TLS. Each `turn` reads the socket at most once, so the
/// reading loop in [`get`] checks the deadline between any two reads.
trait Transport {
    fn socket(&self) -> &TcpStream;
    fn send(&mut self, bytes: &[u8]) -> std::io::Result<()>;
    fn turn(&mut self, buf: &mut [u8]) -> std::io::Result<Turn>;
}

struct Plain(TcpStream);

impl Transport for Plain {
    fn socket(&self) -> &TcpStream {
        &self.0
    }
    fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.0.write_all(bytes)
    }
    fn turn(&mut self, buf: &mut [u8]) -> std::io::Result<Turn> {
        Ok(match self.0.read(buf)? {
            0 => Turn::End { clean: true },
            n => Turn::Data(n),
        })
    }
}

struct Tls {
    conn: rustls::ClientConnection,
    sock: TcpStream,
}

/// A TLS failure as an I/O error whose text says what the host trusts.
fn tls_error(e: rustls::Error) -> std::io::Error {
    let hint = if matches!(e, rustls::Error::InvalidCertificate(_)) {
        " (the host trusts the Mozilla roots built into it and the CA certificates the agent was given with --http-ca-file, never a CA bundle on the node)"
    } else {
        ""
    };
    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("TLS: {e}{hint}"))
}

impl Tls {
    /// Completes the handshake, one socket read or write at a time, each bounded by what
    /// is left until `deadline`.
    fn handshake(&mut self, deadline: Instant) -> std::io::Result<()> {
        while self.conn.is_handshaking() {
            until(&self.sock, deadline)?;
            if self.conn.wants_write() {
                self.conn.write_tls(&mut self.sock)?;
            } else if self.conn.wants_read() {
                if self.conn.read_tls(&mut self.sock)? == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "the server closed the connection during the TLS handshake",
                    ));
                }
                self.conn.process_new_packets().map_err(tls_error)?;
            } else {
                break;
            }
        }
        self.flush()
    }

    fn flush(&mut self) -> std::io::Result<()> {
        while self.conn.wants_write() {
            self.conn.write_tls(&mut self.sock)?;
        }
        Ok(())
    }
}

impl Transport for Tls {
    fn socket(&self) -> &TcpStream {
        &self.sock
    }
    fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.conn.writer().write_all(bytes)?;
        self.flush()
    }
    fn turn(&mut self, buf: &mut [u8]) -> std::io::Result<Turn> {
        match self.conn.reader().read(buf) {
            Ok(0) => return Ok(Turn::End { clean: true }),
            Ok(n) => return Ok(Turn::Data(n)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Ok(Turn::End { clean: false });
            }
            Err(e) => return Err(e),
        }
        // No plaintext buffered: one read from the socket. At its end rustls knows the
        // peer closed, and the next turn's read says whether it did so cleanly.
        self.conn.read_tls(&mut self.sock)?;
        self.conn.process_new_packets().map_err(tls_error)?;
        self.flush()?;
        Ok(Turn::Progress)
    }
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
            &Client::new(&HttpConfig::default()).unwrap(),
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

    /// URLs shaped to pass for a granted host without being it are refused before any
    /// connection: another port, another case, a trailing dot, the name in the query or
    /// the path, credentials in front of it, a scheme the host does not speak.
    #[test]
    fn only_the_granted_host_at_its_port_is_admitted() {
        let client = Client::new(&HttpConfig::default()).unwrap();
        let grants = [HttpGrant {
            host: "dl.k8s.io".into(),
            max_bytes: None,
        }];
        let get = |url: &str| get(&client, &grants, url, 1 << 20, Duration::from_millis(200));
        for url in [
            "https://dl.k8s.io:8443/release/stable.txt",
            "https://DL.K8S.IO/release/stable.txt",
            "https://dl.k8s.io./release/stable.txt",
            "https://evil.example/?dl.k8s.io",
            "https://evil.example/dl.k8s.io/release",
            "https://dl.k8s.io.evil.example/release",
        ] {
            assert!(
                matches!(get(url), Err(HttpRefusal::NotGranted(_))),
                "{url} was not refused as ungranted"
            );
        }
        for url in [
            "https://dl.k8s.io@evil.example/release",
            "ftp://dl.k8s.io/release",
            "https://dl.k8s.io/release\r\nHost: evil",
        ] {
            assert!(
                matches!(get(url), Err(HttpRefusal::Invalid(_))),
                "{url} was not refused as invalid"
            );
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
