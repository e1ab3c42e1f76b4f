//! Documented limits of the host, exercised with the real `http` test plugin against a
//! loopback server: the http grant's `maxBytes` caps the body a plugin may download.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpListener;

use bosun_api::grants::{Grants, HttpGrant};
use bosun_host::NodeContext;
use support::{node, plugins, run_on};

fn node_ctx() -> NodeContext {
    NodeContext {
        node_name: "cp-1".into(),
        roles: vec!["control-plane".into()],
        kubelet_version: Some("v1.34.1".into()),
    }
}

/// Serves one request per body in `bodies`, in order, each with that body; returns the
/// port and the server thread.
fn serve(bodies: Vec<Vec<u8>>) -> (u16, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        for body in bodies {
            let (mut conn, _) = listener.accept().unwrap();
            // Read the whole request head before answering: closing with unread bytes
            // makes the kernel send RST, which the client would see as a reset.
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).unwrap();
                assert!(n > 0, "the client closed before finishing its request");
                head.extend_from_slice(&buf[..n]);
            }
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            // The host may stop reading once the cap is passed; a write error then is fine.
            let _ = conn.write_all(answer.as_bytes());
            let _ = conn.write_all(&body);
        }
    });
    (port, server)
}

/// A body one byte over the grant's `maxBytes` is refused with `host:too-large` naming the
/// cap, though the plugin itself asked for up to 1 MiB; a body of exactly `maxBytes` is
/// delivered whole.
#[test]
fn an_http_body_over_the_grants_max_bytes_is_refused_and_one_at_the_cap_is_not() {
    let cap = 1024usize;
    let (port, server) = serve(vec![vec![b'x'; cap + 1], vec![b'y'; cap]]);
    let node = node();
    let host = node.host();
    let p = node.load(&host, &plugins().http, "http");
    let grants = Grants {
        http: vec![HttpGrant {
            host: format!("127.0.0.1:{port}"),
            max_bytes: Some(cap as u64),
        }],
        ..Grants::default()
    };
    let url = format!(r#"{{"url":"http://127.0.0.1:{port}/file"}}"#);

    let over = run_on(&host, &p, &grants, &node_ctx(), "get", &url).unwrap();
    let e = over.result.unwrap_err();
    assert_eq!(e.code, "host:too-large", "{e:?}");
    assert!(
        e.message
            .contains(&format!("body exceeds the cap of {cap} bytes")),
        "{e:?}"
    );

    let at = run_on(&host, &p, &grants, &node_ctx(), "get", &url).unwrap();
    let o = at.result.unwrap();
    assert_eq!(o.outputs[0].1, "y".repeat(cap));
    server.join().unwrap();
}
