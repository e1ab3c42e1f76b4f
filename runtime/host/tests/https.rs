//! https through the `http` import, with the real `http` test plugin against a TLS server
//! on loopback. The URL names `dl.k8s.io`, as the first-party `packages` plugin's grant
//! does; [`HttpConfig::resolve`] sends the name to the loopback server, and the server's
//! certificate comes from a CA made here. What is checked: the CA must be one the host was
//! given (a certificate for the name from an unknown CA is refused, naming what the host
//! trusts), the certificate must be for the URL's name, a cut-short body without TLS
//! `close_notify` is refused, a server that drips its handshake is cut off at the
//! deadline, redirects come back to the plugin unfollowed, and plain http still goes only
//! to loopback.

use crate::support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use bosun_api::grants::{Grants, HttpGrant};
use bosun_host::{
    CallFailure, LoadedPlugin, NodeContext, Outcome, PluginError, RunOptions, RunReport,
};
use bosun_host::{Host, HttpConfig};
use bosun_test_pki::TestPki;
use support::{Node, node, plugins};

/// Runs the http test plugin's `get` with `params` under dl.k8s.io's grant, within `deadline`.
fn run_for(
    host: &Host,
    p: &LoadedPlugin,
    params: &str,
    deadline: Duration,
) -> Result<RunReport, CallFailure> {
    let ctx = NodeContext {
        node_name: "worker-1".into(),
        roles: vec!["worker".into()],
        kubelet_version: Some("v1.34.1".into()),
    };
    let options = RunOptions {
        dry_run: false,
        resumed: false,
        deadline: Some(deadline),
    };
    host.run(p, &dl_grants(), &ctx, "get", params, options)
}

/// [`run_for`] with a minute's deadline.
fn get(host: &Host, p: &LoadedPlugin, params: &str) -> Result<Outcome, PluginError> {
    run_for(host, p, params, Duration::from_secs(60))
        .unwrap()
        .result
}

/// The message of a GET the host refused as `host:failed`.
fn refused(host: &Host, p: &LoadedPlugin, params: &str) -> String {
    let e = get(host, p, params).unwrap_err();
    assert_eq!(e.code, "host:failed", "{e:?}");
    e.message
}

fn pki(names: &[&str]) -> TestPki {
    TestPki::new("bosun https test CA", names)
}

/// How the server ends each answer.
#[derive(Clone, Copy)]
enum End {
    /// TLS close_notify, then the connection closes.
    CloseNotify,
    /// The connection closes without close_notify.
    Drop,
}

/// Serves `answers` (raw HTTP responses) in order, one connection each, over TLS.
/// Connections whose handshake fails (the client refused the certificate) count too.
fn serve(pki: &TestPki, answers: Vec<(Vec<u8>, End)>) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let config = pki.server_config();
    let server = std::thread::spawn(move || {
        for (answer, end) in answers {
            let (tcp, _) = listener.accept().unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let conn = rustls::ServerConnection::new(Arc::clone(&config)).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match tls.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            if head.is_empty() {
                continue;
            }
            let _ = tls.write_all(&answer);
            if let End::CloseNotify = end {
                tls.conn.send_close_notify();
            }
            let _ = tls.flush();
        }
    });
    (addr, server)
}

fn ok(body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// A host with `http`, and the http test plugin loaded in it.
fn loaded(node: &Node, http: HttpConfig) -> (Host, LoadedPlugin) {
    let mut config = node.config();
    config.http = http;
    let host = Host::new(config).unwrap();
    let p = node.load(&host, &plugins().http, "http");
    (host, p)
}

/// A host that sends dl.k8s.io to `addr` and trusts `pki`'s CA (and only it with
/// `only_it`), with the http test plugin loaded.
fn trusting(node: &Node, pki: &TestPki, addr: SocketAddr, only_it: bool) -> (Host, LoadedPlugin) {
    loaded(
        node,
        HttpConfig {
            resolve: resolve_to(addr),
            ca_certificates: vec![pki.ca.clone()],
            no_web_roots: only_it,
        },
    )
}

/// A host that sends dl.k8s.io to `addr` and trusts only the compiled-in roots.
fn resolving(node: &Node, resolve: Vec<(String, SocketAddr)>) -> (Host, LoadedPlugin) {
    loaded(
        node,
        HttpConfig {
            resolve,
            ..HttpConfig::default()
        },
    )
}

fn dl_grants() -> Grants {
    Grants {
        http: vec![HttpGrant {
            host: "dl.k8s.io".into(),
            max_bytes: Some(1 << 20),
        }],
        ..Grants::default()
    }
}

const URL: &str = r#"{"url":"https://dl.k8s.io/release/v1.34.2/bin/linux/amd64/kubeadm.sha256"}"#;

fn resolve_to(addr: SocketAddr) -> Vec<(String, SocketAddr)> {
    vec![("dl.k8s.io:443".into(), addr)]
}

#[test]
fn https_to_a_granted_name_is_verified_against_the_hosts_roots_only() {
    let pki = pki(&["dl.k8s.io"]);
    let (addr, server) = serve(
        &pki,
        vec![
            (ok("abc123  kubeadm\n"), End::CloseNotify),
            (ok("never read"), End::CloseNotify),
            (
                b"HTTP/1.1 302 Found\r\nLocation: https://elsewhere.example/x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_vec(),
                End::CloseNotify,
            ),
        ],
    );
    let node = node();
    let (host, p) = trusting(&node, &pki, addr, false);
    let o = get(&host, &p, URL).unwrap();
    assert_eq!(o.message, "status 200");
    assert_eq!(o.outputs[0].1, "abc123  kubeadm\n");

    // The same server, the same name, but a host given only the compiled-in roots: the
    // test CA is not among them, so the certificate is refused and nothing is read.
    let (web_only, on_web_only) = resolving(&node, resolve_to(addr));
    let e = refused(&web_only, &on_web_only, URL);
    assert!(e.contains("invalid peer certificate"), "{e}");
    assert!(e.contains("UnknownIssuer"), "{e}");
    assert!(e.contains("never a CA bundle on the node"), "{e}");

    // A redirect is the plugin's to follow or not: the host returns it as it came.
    let r = get(&host, &p, URL).unwrap();
    assert_eq!(r.message, "status 302");
    server.join().unwrap();
}

#[test]
fn a_certificate_for_another_name_is_refused_though_its_ca_is_trusted() {
    let pki = pki(&["mirror.example.com"]);
    let (addr, server) = serve(&pki, vec![(ok("x"), End::CloseNotify)]);
    let node = node();
    let (host, p) = trusting(&node, &pki, addr, true);
    let e = refused(&host, &p, URL);
    assert!(
        e.contains(r#"certificate not valid for name "dl.k8s.io"; certificate is only valid for DnsName("mirror.example.com")"#),
        "{e}"
    );
    server.join().unwrap();
}

/// Without close_notify, the end of the connection could be an attacker's: the body is
/// taken only when it has the length the server announced.
#[test]
fn a_tls_body_cut_short_without_close_notify_is_refused_and_a_whole_one_is_not() {
    let pki = pki(&["dl.k8s.io"]);
    let cut =
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\nonly part".to_vec();
    let (addr, server) = serve(&pki, vec![(cut, End::Drop), (ok("whole body"), End::Drop)]);
    let node = node();
    let (host, p) = trusting(&node, &pki, addr, false);
    let e = refused(&host, &p, URL);
    assert!(
        e.contains("without close_notify after 9 body bytes of the 100 it announced"),
        "{e}"
    );
    let o = get(&host, &p, URL).unwrap();
    assert_eq!(o.outputs[0].1, "whole body");
    server.join().unwrap();
}

/// A server that sends the start of a TLS record and then one byte every 50 ms keeps
/// each socket read short; the run's deadline (2 s) still ends the GET, as a timeout.
#[test]
fn a_server_that_drips_its_tls_handshake_is_cut_off_at_the_deadline() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        // A handshake record header announcing 16 KiB, then its body a byte at a time.
        let _ = s.write_all(&[0x16, 0x03, 0x03, 0x40, 0x00]);
        for _ in 0..1200 {
            if s.write_all(&[0]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let node = node();
    let (host, p) = resolving(&node, resolve_to(addr));
    let r = run_for(&host, &p, URL, Duration::from_secs(2)).unwrap();
    let e = r.result.unwrap_err();
    assert_eq!(e.code, "host:timeout", "{e:?}");
    // Without the deadline between reads the handshake would go on for the minute of
    // drips and end as a failure (the server closes), not a timeout.
    drop(server);
}

#[test]
fn plain_http_goes_to_loopback_only_whatever_the_name_resolves_to() {
    let node = node();
    let (host, p) = resolving(
        &node,
        vec![("dl.k8s.io:80".into(), "192.0.2.1:80".parse().unwrap())],
    );
    let e = refused(
        &host,
        &p,
        r#"{"url":"http://dl.k8s.io/release/stable.txt"}"#,
    );
    assert!(
        e.contains(
            "resolves to 192.0.2.1, not a loopback address; plain http is only allowed to loopback"
        ),
        "{e}"
    );
}

#[test]
fn a_ca_bundle_that_is_not_pem_is_refused_naming_its_source() {
    let mut http = HttpConfig::default();
    let e = http
        .add_ca_pem(b"not a certificate", "/etc/bosun/mirror-ca.pem")
        .unwrap_err();
    assert!(
        e.contains("/etc/bosun/mirror-ca.pem: no CERTIFICATE block"),
        "{e}"
    );
    let pki = pki(&["dl.k8s.io"]);
    assert_eq!(http.add_ca_pem(pki.ca_pem.as_bytes(), "ca.pem"), Ok(1));
    assert_eq!(http.ca_certificates, vec![pki.ca]);
}
