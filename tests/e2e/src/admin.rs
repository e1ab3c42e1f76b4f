//! The admin server (`/live`, `/ready`, `/metrics`) of a controller or agent started by a
//! test or the bench: a free loopback port to give it, and plain HTTP/1.1 requests to it.

use std::io::{Read, Write};
use std::time::Duration;

use anyhow::{Context, Result};

/// A free loopback port for an admin server (bound and released; the process binds it
/// right after).
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// `GET path` on the admin server at `port`: status code and body.
pub fn get(port: u16, path: &str) -> Result<(u16, String)> {
    request(port, "GET", path)
}

/// `method path` on the admin server at `port`: status code and body.
pub fn request(port: u16, method: &str, path: &str) -> Result<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .with_context(|| format!("not an HTTP answer: {answer}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("no status in {head}"))?;
    Ok((code, body.to_string()))
}
