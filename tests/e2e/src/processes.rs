//! Child processes that never outlive the test that started them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result, bail};

/// Child processes, each logging to `<logs>/<name>.log`, killed with SIGKILL and reaped
/// when this guard drops, however the test ends (assertion, `?`, panic).
#[derive(Debug)]
pub struct Processes {
    children: Vec<(String, Child)>,
    logs: PathBuf,
}

impl Processes {
    /// No processes yet; logs go to `logs` (created if missing).
    pub fn new(logs: &Path) -> Result<Processes> {
        std::fs::create_dir_all(logs).with_context(|| format!("creating {}", logs.display()))?;
        Ok(Processes {
            children: Vec::new(),
            logs: logs.to_path_buf(),
        })
    }

    /// The directory the logs are in.
    pub fn logs(&self) -> &Path {
        &self.logs
    }

    /// The log file of `name`.
    pub fn log_of(&self, name: &str) -> PathBuf {
        self.logs.join(format!("{name}.log"))
    }

    /// Starts `cmd` as `name` (stdin closed, stdout and stderr appended to its log, so a
    /// restarted process keeps its predecessor's lines). Names are unique: an earlier
    /// process of the same name must have been [`kill`](Self::kill)ed.
    pub fn spawn(&mut self, name: &str, cmd: &mut Command) -> Result<()> {
        if self.children.iter().any(|(n, _)| n == name) {
            bail!("a process named {name} is already running; kill it first");
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_of(name))
            .with_context(|| format!("opening the log of {name}"))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        self.children.push((name.to_string(), child));
        Ok(())
    }

    /// Every process's name and id.
    pub fn pids(&self) -> Vec<(String, u32)> {
        self.children
            .iter()
            .map(|(n, c)| (n.clone(), c.id()))
            .collect()
    }

    /// Kills `name` with SIGKILL (no chance to clean up, as a crash or an OOM kill) and
    /// reaps it.
    pub fn kill(&mut self, name: &str) -> Result<()> {
        let index = self
            .children
            .iter()
            .position(|(n, _)| n == name)
            .with_context(|| format!("no process named {name}"))?;
        let (_, mut child) = self.children.remove(index);
        child.kill().with_context(|| format!("killing {name}"))?;
        child.wait().with_context(|| format!("reaping {name}"))?;
        Ok(())
    }

    /// Sends SIGTERM to `name`, as the kubelet does to a Pod being deleted or rolled, and
    /// waits up to `within` for it to exit by itself; returns how it exited. A process still
    /// running then is SIGKILLed, and that is an error.
    pub async fn terminate(
        &mut self,
        name: &str,
        within: std::time::Duration,
    ) -> Result<std::process::ExitStatus> {
        let index = self
            .children
            .iter()
            .position(|(n, _)| n == name)
            .with_context(|| format!("no process named {name}"))?;
        let (_, mut child) = self.children.remove(index);
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .context("running kill -TERM")?;
        if !sent.success() {
            let _ = child.kill();
            let _ = child.wait();
            bail!("kill -TERM {name} failed");
        }
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if std::time::Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "{name} was still running {within:?} after SIGTERM (SIGKILLed now); see {}",
                    self.log_of(name).display()
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Fails if a process already exited (it would leave the test waiting), naming its log.
    pub fn check_alive(&mut self) -> Result<()> {
        for (name, child) in &mut self.children {
            if let Some(status) = child.try_wait()? {
                bail!(
                    "{name} exited early with {status}; see {}",
                    self.logs.join(format!("{name}.log")).display()
                );
            }
        }
        Ok(())
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
