//! A TCP relay in front of the lab's API server that can stall the connections it carries,
//! the way an API server that is up but no longer delivers behaves: on a real control plane
//! whose etcd member a renewal restarted, the API server kept its watches open and sent
//! nothing for 97 s (docs/benchmarks.md, "API-server restarts").
//!
//! [`StallingRelay::stall_open_connections`] stalls every connection open at that moment:
//! what the client sends still reaches the API server, but nothing more comes back (bytes
//! from the server are held, an end of stream is not passed on). Connections opened later
//! relay normally. TLS passes through untouched (the lab's serving certificate names
//! 127.0.0.1, whatever the port).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result};
use bosun_lab::LabHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The relay: listens on a loopback port until dropped.
pub struct StallingRelay {
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    /// Connections numbered below this are stalled.
    stalled_below: Arc<AtomicU64>,
    /// The number the next connection gets.
    next: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for StallingRelay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl StallingRelay {
    /// A relay to `127.0.0.1:upstream` on a free loopback port.
    pub async fn start(upstream: u16) -> Result<StallingRelay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let stalled_below = Arc::new(AtomicU64::new(0));
        let next = Arc::new(AtomicU64::new(0));
        let (stall, count) = (stalled_below.clone(), next.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let id = count.fetch_add(1, Ordering::SeqCst);
                let stall = stall.clone();
                tokio::spawn(async move {
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await {
                        relay(client, server, id, stall).await;
                    }
                });
            }
        });
        Ok(StallingRelay {
            port,
            stalled_below,
            next,
            accept,
        })
    }

    /// Stalls every connection open now (see the module documentation); returns how many
    /// were opened so far.
    pub fn stall_open_connections(&self) -> u64 {
        let open = self.next.load(Ordering::SeqCst);
        self.stalled_below.store(open, Ordering::SeqCst);
        open
    }

    /// A copy of the lab's kubeconfig whose server is this relay, written for a controller
    /// in the target directory's `dir` (made if missing); returns its path.
    pub fn controller_kubeconfig(&self, lab: &LabHandle, dir: &str) -> Result<PathBuf> {
        let dir = crate::target_dir().join(dir);
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("controller-{}.kubeconfig", self.port));
        self.kubeconfig(lab, &path)?;
        Ok(path)
    }

    /// A copy of the lab's kubeconfig at `path` whose server is this relay.
    pub fn kubeconfig(&self, lab: &LabHandle, path: &Path) -> Result<()> {
        let text = std::fs::read_to_string(&lab.kubeconfig)
            .with_context(|| format!("reading {}", lab.kubeconfig.display()))?;
        let direct = format!("https://127.0.0.1:{}", lab.ports.apiserver);
        anyhow::ensure!(
            text.contains(&direct),
            "the lab's kubeconfig does not name {direct}"
        );
        let relayed = text.replace(&direct, &format!("https://127.0.0.1:{}", self.port));
        std::fs::write(path, relayed).with_context(|| format!("writing {}", path.display()))
    }
}

/// Copies both ways until either side ends; bytes from the server are held for good once
/// the connection is stalled.
async fn relay(client: TcpStream, server: TcpStream, id: u64, stalled_below: Arc<AtomicU64>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    };
    let down = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = server_read.read(&mut buf).await.unwrap_or(0);
            if id < stalled_below.load(Ordering::SeqCst) {
                // Stalled: hold this connection open and silent.
                std::future::pending::<()>().await;
            }
            if n == 0 || client_write.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Either direction ending ends the connection (the client dropped it, or the server
    // closed a connection that is not stalled).
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}
