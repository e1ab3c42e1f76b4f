//! Child processes: one-shot commands, and the detached control-plane daemons with their
//! pidfiles and logs.

use std::fs::File;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{LabError, Result};

/// Runs `cmd` to completion and returns its stdout; a non-zero exit becomes
/// [`LabError::Command`] carrying stderr and stdout.
pub(crate) fn run(cmd: &mut Command) -> Result<String> {
    let shown = describe(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| LabError::Command {
            command: shown.clone(),
            status: "not started".into(),
            output: source.to_string(),
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(LabError::Command {
            command: shown,
            status: out.status.to_string(),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            )
            .trim()
            .to_string(),
        })
    }
}

fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A long-running control-plane process of the lab, identified by its name.
#[derive(Clone, Debug)]
pub struct Daemon {
    /// Component name, also the binary's file name.
    pub name: &'static str,
    /// Its pidfile.
    pub pidfile: PathBuf,
    /// Its combined stdout/stderr log.
    pub log: PathBuf,
}

impl Daemon {
    pub(crate) fn new(state_dir: &Path, name: &'static str) -> Self {
        Self {
            name,
            pidfile: state_dir.join("run").join(format!("{name}.pid")),
            log: state_dir.join("logs").join(format!("{name}.log")),
        }
    }

    /// Starts `binary args` detached: its own process group (a Ctrl-C or the end of the starting
    /// process does not reach it), stdin from /dev/null, output appended to the log; writes the
    /// pidfile. Returns the pid.
    pub(crate) fn spawn(&self, binary: &Path, args: &[String]) -> Result<u32> {
        for dir in [self.pidfile.parent(), self.log.parent()]
            .into_iter()
            .flatten()
        {
            std::fs::create_dir_all(dir).map_err(LabError::io("creating", dir))?;
        }
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(LabError::io("opening", &self.log))?;
        let log2 = log
            .try_clone()
            .map_err(LabError::io("duplicating", &self.log))?;
        let mut cmd = Command::new(binary);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .process_group(0);
        // Keep the exact command line next to the log: the first thing to read when it fails.
        let cmdline = self.log.with_extension("cmd");
        std::fs::write(&cmdline, describe(&cmd) + "\n")
            .map_err(LabError::io("writing", &cmdline))?;
        let child = cmd.spawn().map_err(LabError::io("starting", binary))?;
        let pid = child.id();
        std::fs::write(&self.pidfile, format!("{pid}\n"))
            .map_err(LabError::io("writing", &self.pidfile))?;
        Ok(pid)
    }

    /// The pid of the running process, if the pidfile names a live (not zombie) process whose
    /// executable is this component's binary: a recycled pid is not mistaken for ours.
    pub fn running_pid(&self) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(&self.pidfile)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        alive(pid, self.name).then_some(pid)
    }

    /// Stops the process if it runs: SIGTERM, then SIGKILL after `grace`. Removes the pidfile.
    /// Returns whether a process was stopped.
    pub(crate) fn stop(&self, grace: Duration) -> Result<bool> {
        let Some(pid) = self.running_pid() else {
            let _ = std::fs::remove_file(&self.pidfile);
            return Ok(false);
        };
        let _ = run(Command::new("kill").args(["-TERM", &pid.to_string()]));
        let deadline = Instant::now() + grace;
        while alive(pid, self.name) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        if alive(pid, self.name) {
            run(Command::new("kill").args(["-KILL", &pid.to_string()]))?;
            while alive(pid, self.name) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = std::fs::remove_file(&self.pidfile);
        Ok(true)
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    pub(crate) fn died(&self) -> LabError {
        LabError::ProcessDied {
            component: self.name,
            log: self.log.clone(),
            tail: self.log_tail(20),
        }
    }
}

fn alive(pid: u32, name: &str) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // Field 3, after the parenthesised command name, is the state; Z and X are dead.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    if matches!(state, Some("Z" | "X") | None) {
        return false;
    }
    std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|exe| exe.file_name().map(|f| f.to_string_lossy().into_owned()))
        .is_some_and(|file| file == name || file.starts_with(&format!("{name} ")))
}

/// Fails with [`LabError::PortTaken`] when something already listens on `port` on 127.0.0.1.
pub(crate) fn ensure_port_free(port: u16, component: &'static str) -> Result<()> {
    match TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
        Ok(listener) => {
            drop(listener);
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            Err(LabError::PortTaken { port, component })
        }
        Err(e) => Err(LabError::Io {
            action: "probing port",
            path: PathBuf::from(format!("127.0.0.1:{port}")),
            source: e,
        }),
    }
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
pub(crate) fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_port_is_reported_with_its_component() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        match ensure_port_free(port, "kube-apiserver") {
            Err(LabError::PortTaken { port: p, component }) => {
                assert_eq!((p, component), (port, "kube-apiserver"))
            }
            other => panic!("expected PortTaken, got {other:?}"),
        }
        drop(listener);
        assert!(ensure_port_free(port, "kube-apiserver").is_ok());
    }

    #[test]
    fn a_pidfile_of_another_program_is_not_running() {
        let dir = std::env::temp_dir().join(format!("bosun-lab-test-{}", std::process::id()));
        let daemon = Daemon::new(&dir, "etcd");
        std::fs::create_dir_all(daemon.pidfile.parent().unwrap()).unwrap();
        // Our own pid is alive, but its executable is not etcd: a recycled pid is not ours.
        std::fs::write(&daemon.pidfile, format!("{}\n", std::process::id())).unwrap();
        assert_eq!(daemon.running_pid(), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
