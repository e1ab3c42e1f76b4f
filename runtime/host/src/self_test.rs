//! A check of the kernel boundary of granted commands on the node the host runs on, as it
//! is deployed (`bosun-agent self-test`): each probe runs a real command of the node through
//! the same runner as a plugin's granted command, trying one thing the boundary must stop,
//! and reports whether the boundary held. The host's unit tests prove each class with the
//! enforcement removed too; this proves it where the agent really runs (its capabilities,
//! its seccomp profile, its kernel).
//!
//! The probes use only programs a Debian or RHEL node has (`/bin/sh`, `dd`, `ln`, `chmod`,
//! `mkfifo`, `setsid`, `sleep`, `bash`) and write only into a scratch directory of their own
//! under the agent's state directory on the node, which they remove.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::ExecIsolation;
use crate::confine::{Sandbox, SandboxPath, Support, support};
use crate::exec::{CommandOutput, CommandSpec, run};

/// One probe's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    /// What the boundary must stop, in a sentence.
    pub name: &'static str,
    /// Whether it stopped it.
    pub held: bool,
    /// What the command printed, or why the probe could not run.
    pub detail: String,
}

/// Every probe's result, and what the kernel supports.
#[derive(Clone, Debug)]
pub struct SelfTest {
    pub support: Support,
    pub probes: Vec<Probe>,
}

impl SelfTest {
    /// Every probe held and the kernel lacks nothing.
    pub fn passed(&self) -> bool {
        self.probes.iter().all(|p| p.held) && self.support.missing().is_empty()
    }
}

/// Runs the probes under `host_root`, with a scratch directory at `scratch` (a node path,
/// such as `/var/lib/bosun/self-test`; created, and removed afterwards).
pub fn confinement_self_test(
    host_root: &Path,
    isolation: ExecIsolation,
    scratch: &str,
) -> Result<SelfTest, String> {
    crate::exec::normalized_absolute(scratch).map_err(|e| format!("scratch directory: {e}"))?;
    let node_dir = format!("{scratch}-{}", std::process::id());
    let dir = host_root.join(node_dir.trim_start_matches('/'));
    std::fs::create_dir_all(dir.join("granted"))
        .and_then(|()| std::fs::create_dir_all(dir.join("outside")))
        .map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let probes = Probes {
        root: host_root.to_owned(),
        isolation,
        node_dir,
        dir: dir.clone(),
    }
    .all();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(SelfTest {
        support: support().clone(),
        probes,
    })
}

struct Probes {
    root: PathBuf,
    isolation: ExecIsolation,
    /// The scratch directory as the node (and the command) names it.
    node_dir: String,
    /// The same directory as this process reaches it.
    dir: PathBuf,
}

fn path(p: String, write: bool) -> SandboxPath {
    SandboxPath {
        path: p,
        write,
        execute: false,
        optional: false,
        origin: "the self-test",
    }
}

fn shown(out: &Result<CommandOutput, String>) -> String {
    match out {
        Ok(o) => {
            let parts: Vec<String> = [&o.stdout, &o.stderr]
                .iter()
                .map(|b| String::from_utf8_lossy(b).trim().replace('\n', "; "))
                .filter(|t| !t.is_empty())
                .collect();
            format!("exit {}; {}", o.exit_code, parts.join("; "))
        }
        Err(e) => e.clone(),
    }
}

impl Probes {
    fn run(&self, command: &str, args: &[&str], sandbox: Sandbox) -> Result<CommandOutput, String> {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        run(CommandSpec {
            root: &self.root,
            isolation: self.isolation,
            command,
            args: &args,
            stdin: None,
            timeout: Duration::from_secs(30),
            max_output: 16 << 10,
            sandbox: &sandbox,
        })
        .map_err(|e| format!("{e:?}"))
    }

    fn granted(&self) -> Sandbox {
        Sandbox {
            paths: vec![path(format!("{}/granted", self.node_dir), true)],
            ..Sandbox::default()
        }
    }

    fn all(&self) -> Vec<Probe> {
        vec![
            self.outlive(),
            self.paths(),
            self.proc_root(),
            self.signals(),
            self.descriptors(),
            self.network(),
            self.metadata(),
            self.fifo(),
        ]
    }

    fn outlive(&self) -> Probe {
        let granted = format!("{}/granted", self.node_dir);
        let script = "if [ \"$PPID\" -gt 0 ]; then kill -KILL $PPID; echo \"kill keeper: $?\"; fi; \
                      setsid /bin/sh -c 'echo started > \"$0/started\"; sleep 1; echo late > \"$0/late\"' \"$0\" & \
                      while [ ! -s \"$0/started\" ]; do sleep 0.01; done";
        let out = self.run("/bin/sh", &["-c", script, &granted], self.granted());
        std::thread::sleep(Duration::from_millis(1500));
        let started = self.dir.join("granted/started").exists();
        let late = self.dir.join("granted/late").exists();
        let keeper_alive = out
            .as_ref()
            .is_ok_and(|o| !String::from_utf8_lossy(&o.stdout).contains("kill keeper: 0"));
        Probe {
            name: "a command can neither kill its keeper nor leave a process running after its step",
            held: started && !late && keeper_alive,
            detail: format!(
                "{} (daemon started: {started}; wrote after the step: {late})",
                shown(&out)
            ),
        }
    }

    fn paths(&self) -> Probe {
        let outside = format!("{}/outside", self.node_dir);
        let granted = format!("{}/granted", self.node_dir);
        let _ =
            std::os::unix::fs::symlink("../outside/through-link", self.dir.join("granted/link"));
        let direct = self.run(
            "/bin/dd",
            &["if=/dev/zero", &format!("of={outside}/direct"), "count=1"],
            self.granted(),
        );
        let linked = self.run(
            "/bin/dd",
            &["if=/dev/zero", &format!("of={granted}/link"), "count=1"],
            self.granted(),
        );
        let control = self.run(
            "/bin/dd",
            &["if=/dev/zero", &format!("of={granted}/inside"), "count=1"],
            self.granted(),
        );
        let wrote_direct = self.dir.join("outside/direct").exists();
        let wrote_linked = self.dir.join("outside/through-link").exists();
        let wrote_inside = self.dir.join("granted/inside").exists();
        Probe {
            name: "a command writes nothing outside its sandbox, whatever the argument's shape (`of=`, a planted symlink)",
            held: !wrote_direct && !wrote_linked && wrote_inside,
            detail: format!(
                "outside: {}; through a symlink: {}; inside (allowed): {}",
                shown(&direct),
                shown(&linked),
                shown(&control)
            ),
        }
    }

    fn proc_root(&self) -> Probe {
        let me = std::process::id().to_string();
        let out = self.run(
            "/bin/sh",
            &[
                "-c",
                "for p in 1 \"$0\"; do if read l < \"/proc/$p/root/etc/hostname\"; then echo \"read /proc/$p/root/etc/hostname: $l\"; fi; done; true",
                &me,
            ],
            Sandbox::default(),
        );
        let read = out.as_ref().map_or(true, |o| {
            String::from_utf8_lossy(&o.stdout).contains("read /proc")
        });
        Probe {
            name: "a command cannot reach another process's file system through /proc/<pid>/root (PID 1, the agent)",
            held: out.is_ok() && !read,
            detail: shown(&out),
        }
    }

    fn signals(&self) -> Probe {
        let me = std::process::id().to_string();
        let out = self.run(
            "/bin/sh",
            &[
                "-c",
                "echo \"self: $$\"; kill -0 1; echo \"init: $?\"; kill -0 \"$0\"; echo \"agent: $?\"",
                &me,
            ],
            Sandbox::default(),
        );
        let text = out
            .as_ref()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        // In a PID namespace of its own (an agent with SYS_ADMIN) the command is PID 1 and
        // sees no process outside: then only the agent's pid is a probe.
        let own_namespace = text.contains("self: 1\n");
        Probe {
            name: "a command can signal no process outside its own (PID 1, the agent)",
            held: (own_namespace || text.contains("init: 1")) && text.contains("agent: 1"),
            detail: shown(&out),
        }
    }

    #[allow(unsafe_code)]
    fn descriptors(&self) -> Probe {
        let file = match std::fs::File::open(&self.root) {
            Ok(f) => f,
            Err(e) => {
                return Probe {
                    name: "no descriptor of the agent reaches a command",
                    held: false,
                    detail: format!("could not open a descriptor to test with: {e}"),
                };
            }
        };
        // SAFETY: dup of a descriptor owned here; the copy is closed below.
        let leaked = unsafe { libc::dup(std::os::fd::AsRawFd::as_raw_fd(&file)) };
        let out = self.run(
            "/bin/sh",
            &[
                "-c",
                "if [ -e \"/proc/$$/fd/$0\" ]; then echo leaked; else echo closed; fi",
                &leaked.to_string(),
            ],
            Sandbox::default(),
        );
        if leaked >= 0 {
            // SAFETY: the duplicate made above.
            unsafe { libc::close(leaked) };
        }
        Probe {
            name: "no descriptor of the agent reaches a command",
            held: out
                .as_ref()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "closed"),
            detail: shown(&out),
        }
    }

    fn network(&self) -> Probe {
        let connect = |port: u16, sandbox: Sandbox| {
            self.run(
                "/bin/bash",
                &[
                    "-c",
                    "exec 3<>\"/dev/tcp/127.0.0.1/$0\" && echo connected",
                    &port.to_string(),
                ],
                sandbox,
            )
        };
        let tcp = |ports: Vec<u16>| Sandbox {
            tcp_connect: ports,
            ..Sandbox::default()
        };
        let stderr = |o: &Result<CommandOutput, String>| {
            o.as_ref()
                .map(|o| {
                    String::from_utf8_lossy(&o.stderr).into_owned()
                        + &String::from_utf8_lossy(&o.stdout)
                })
                .unwrap_or_default()
        };
        // Port 9 (discard) is closed on a node: a connect that gets through is refused by
        // the peer, which tells "allowed" from "stopped by the sandbox".
        let none = connect(9, Sandbox::default());
        let other = connect(9, tcp(vec![6443]));
        let granted = connect(9, tcp(vec![9]));
        let stopped = |o: &Result<CommandOutput, String>| {
            let e = stderr(o);
            e.contains("Operation not permitted") || e.contains("Permission denied")
        };
        let through = |o: &Result<CommandOutput, String>| {
            let e = stderr(o);
            e.contains("Connection refused") || e.contains("connected")
        };
        Probe {
            name: "no network without a grant, and only the granted TCP ports with one",
            held: stopped(&none) && stopped(&other) && through(&granted),
            detail: format!(
                "no grant: {}; port 6443 granted: {}; port 9 granted (allowed): {}",
                shown(&none),
                shown(&other),
                shown(&granted)
            ),
        }
    }

    fn metadata(&self) -> Probe {
        use std::os::unix::fs::PermissionsExt;
        let file = self.dir.join("granted/mode");
        let _ = std::fs::write(&file, "");
        let _ = std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644));
        let out = self.run(
            "/bin/chmod",
            &["4755", &format!("{}/granted/mode", self.node_dir)],
            self.granted(),
        );
        let mode = std::fs::metadata(&file).map_or(0, |m| m.permissions().mode() & 0o7777);
        Probe {
            name: "a command changes no file's mode or owner without changeMetadata",
            held: mode == 0o644,
            detail: format!("{} (mode now {mode:o})", shown(&out)),
        }
    }

    fn fifo(&self) -> Probe {
        let out = self.run(
            "/usr/bin/mkfifo",
            &[&format!("{}/granted/fifo", self.node_dir)],
            self.granted(),
        );
        let made = self.dir.join("granted/fifo").symlink_metadata().is_ok();
        Probe {
            name: "a command makes no FIFO, device or socket, even where it may write",
            held: !made,
            detail: shown(&out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The self-test on this machine's own root, from a thread without SYS_ADMIN as the
    /// shipped agent: every probe holds (as root, on a kernel with the whole boundary; the
    /// unit tests in `confine.rs` show each class escaping without its enforcement).
    #[test]
    fn every_probe_holds_on_this_machine() {
        crate::exec::tests::require_root("every_probe_holds_on_this_machine");
        let dir = tempfile::tempdir().unwrap();
        let scratch = dir.path().join("scratch");
        // As the shipped DaemonSet runs it: without SYS_ADMIN (no namespaces for commands).
        let report = std::thread::spawn(move || {
            let mut caps = rustix::thread::capabilities(None).unwrap();
            caps.effective -= rustix::thread::CapabilitySet::SYS_ADMIN;
            rustix::thread::set_capabilities(None, caps).unwrap();
            confinement_self_test(
                Path::new("/"),
                ExecIsolation::Chroot,
                scratch.to_str().unwrap(),
            )
        })
        .join()
        .unwrap()
        .unwrap();
        let escaped: Vec<&Probe> = report.probes.iter().filter(|p| !p.held).collect();
        assert!(escaped.is_empty(), "{escaped:#?}");
        assert!(report.support.missing().is_empty(), "{:?}", report.support);
        assert_eq!(report.probes.len(), 8);
        assert!(report.passed());
    }
}
