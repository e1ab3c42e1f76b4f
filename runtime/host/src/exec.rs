//! Running host commands: matching a request against `exec` grants, and starting the
//! command under the host root with an empty environment, a timeout and output caps.

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bosun_api::grants::ExecGrant;

use crate::config::ExecIsolation;

/// `PATH` is the only variable a command gets.
pub(crate) const COMMAND_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Default per-command timeout when the grant sets none.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Default cap on stdout and stderr, each, when the grant sets none.
pub(crate) const DEFAULT_MAX_OUTPUT: u64 = 1 << 20;

/// Why a request does not match the grants. `NotGranted` carries the message the
/// plugin sees (it names the command and arguments).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    Invalid(String),
    NotGranted(String),
}

/// Checks that `path` is absolute and has no `.`, `..` or empty components.
pub(crate) fn normalized_absolute(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("`{path}` is not an absolute path"));
    }
    if path.contains('\0') {
        return Err("path contains a NUL byte".into());
    }
    if path.len() > 1 && (path.ends_with('/') || path.contains("//")) {
        return Err(format!("`{path}` has empty components"));
    }
    for c in Path::new(path).components() {
        match c {
            Component::RootDir | Component::Normal(_) => {}
            _ => return Err(format!("`{path}` has `.` or `..` components")),
        }
    }
    if path.split('/').any(|c| c == "." || c == "..") {
        return Err(format!("`{path}` has `.` or `..` components"));
    }
    Ok(())
}

/// Whether one granted argument list matches `args` (see [`ExecGrant::args`]).
fn patterns_match(patterns: &[String], args: &[String]) -> bool {
    let (fixed, rest_any) = match patterns.split_last() {
        Some((last, init)) if last == "**" => (init, true),
        _ => (patterns, false),
    };
    let count_ok = if rest_any { args.len() >= fixed.len() } else { args.len() == fixed.len() };
    count_ok
        && fixed.iter().zip(args).all(|(p, a)| glob::Pattern::new(p).is_ok_and(|p| p.matches(a)))
}

/// Finds the grant that allows `command args`, or says why none does.
pub(crate) fn authorize<'g>(
    grants: &'g [ExecGrant],
    command: &str,
    args: &[String],
) -> Result<&'g ExecGrant, Refusal> {
    normalized_absolute(command).map_err(|e| Refusal::Invalid(format!("command: {e}")))?;
    let mut for_command = grants.iter().filter(|g| g.command == command).peekable();
    if for_command.peek().is_none() {
        return Err(Refusal::NotGranted(format!("exec: {command} (no exec grant names this command)")));
    }
    for grant in for_command {
        let allowed = if grant.args.is_empty() {
            args.is_empty()
        } else {
            grant.args.iter().any(|p| patterns_match(p, args))
        };
        if allowed {
            return Ok(grant);
        }
    }
    let granted: Vec<String> = grants
        .iter()
        .filter(|g| g.command == command)
        .flat_map(|g| if g.args.is_empty() { vec!["(no arguments)".to_owned()] } else { g.args.iter().map(|p| p.join(" ")).collect() })
        .collect();
    Err(Refusal::NotGranted(format!(
        "exec: {command} {} (arguments match none of the granted patterns: {})",
        args.join(" "),
        granted.join(" | ")
    )))
}

/// Checks a grant's own shape, once per run, so a typo in a grant is reported as such
/// instead of as a refused command.
pub(crate) fn validate_grant(grant: &ExecGrant) -> Result<(), String> {
    normalized_absolute(&grant.command)?;
    for list in &grant.args {
        for (i, p) in list.iter().enumerate() {
            if p == "**" && i + 1 != list.len() {
                return Err(format!("`**` may only be the last pattern, found in {list:?}"));
            }
            glob::Pattern::new(p).map_err(|e| format!("pattern `{p}`: {e}"))?;
        }
    }
    Ok(())
}

/// What a finished command produced.
#[derive(Debug)]
pub(crate) struct CommandOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub truncated: bool,
}

#[derive(Debug)]
pub(crate) enum CommandError {
    Timeout(Duration),
    Failed(String),
}

/// One command to start.
pub(crate) struct CommandSpec<'a> {
    pub root: &'a Path,
    pub isolation: ExecIsolation,
    /// Absolute path as seen inside the root.
    pub command: &'a str,
    pub args: &'a [String],
    pub stdin: Option<Vec<u8>>,
    pub timeout: Duration,
    pub max_output: u64,
}

/// Whether `root` is the real `/` (then no chroot or path rewriting is needed).
pub(crate) fn is_real_root(root: &Path) -> bool {
    root.canonicalize().is_ok_and(|p| p == Path::new("/"))
}

/// Starts the command, waits for it up to its timeout (killing its whole process group
/// then) and returns its capped output. Output beyond the cap is read and discarded so
/// the command never blocks on a full pipe.
pub(crate) fn run(spec: CommandSpec<'_>) -> Result<CommandOutput, CommandError> {
    let rel = spec.command.trim_start_matches('/');
    let real_root = is_real_root(spec.root);
    let mut cmd = if real_root {
        Command::new(spec.command)
    } else {
        match spec.isolation {
            ExecIsolation::Chroot => {
                let mut cmd = Command::new(spec.command);
                chroot_before_exec(&mut cmd, spec.root)?;
                cmd
            }
            ExecIsolation::ResolveOnly => {
                let resolved = resolve_under(spec.root, rel)?;
                let mut cmd = Command::new(resolved);
                cmd.current_dir(spec.root);
                cmd
            }
        }
    };
    cmd.args(spec.args)
        .env_clear()
        .env("PATH", COMMAND_PATH)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if spec.stdin.is_some() { Stdio::piped() } else { Stdio::null() });
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .spawn()
        .map_err(|e| CommandError::Failed(format!("could not start {}: {e}", spec.command)))?;
    let pid = child.id();

    if let (Some(input), Some(mut pipe)) = (spec.stdin, child.stdin.take()) {
        std::thread::spawn(move || {
            use std::io::Write;
            // A command that does not read its stdin closes the pipe: ignore that.
            let _ = pipe.write_all(&input);
        });
    }
    let cap = spec.max_output;
    let out = child.stdout.take().map(|p| std::thread::spawn(move || read_capped(p, cap)));
    let err = child.stderr.take().map(|p| std::thread::spawn(move || read_capped(p, cap)));

    let started = Instant::now();
    let mut pause = Duration::from_micros(100);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if started.elapsed() >= spec.timeout => break None,
            Ok(None) => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(10));
            }
            Err(e) => {
                kill_group(pid);
                return Err(CommandError::Failed(format!("waiting for {}: {e}", spec.command)));
            }
        }
    };
    // Whatever the command left behind in its process group goes with it: otherwise a
    // background child holding the pipes would keep the readers (and this call) waiting.
    kill_group(pid);
    let Some(status) = status else {
        let _ = child.wait();
        return Err(CommandError::Timeout(spec.timeout));
    };
    let (stdout, t1) = out.map(|h| h.join().unwrap_or_default()).unwrap_or_default();
    let (stderr, t2) = err.map(|h| h.join().unwrap_or_default()).unwrap_or_default();
    Ok(CommandOutput { exit_code: status.code().unwrap_or(-1), stdout, stderr, truncated: t1 || t2 })
}

fn read_capped(mut pipe: impl Read, cap: u64) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = usize::try_from(cap.saturating_sub(kept.len() as u64)).unwrap_or(usize::MAX);
                if n > room {
                    truncated = true;
                }
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    (kept, truncated)
}

/// Resolves `rel` under `root` for [`ExecIsolation::ResolveOnly`], refusing a path
/// whose symlinks lead outside the root.
fn resolve_under(root: &Path, rel: &str) -> Result<PathBuf, CommandError> {
    let root = root
        .canonicalize()
        .map_err(|e| CommandError::Failed(format!("host root {}: {e}", root.display())))?;
    let path = root
        .join(rel)
        .canonicalize()
        .map_err(|e| CommandError::Failed(format!("command /{rel} under host root {}: {e}", root.display())))?;
    if !path.starts_with(&root) {
        return Err(CommandError::Failed(format!(
            "command /{rel} resolves to {} outside the host root {}",
            path.display(),
            root.display()
        )));
    }
    Ok(path)
}

/// Makes the child `chroot(2)` into `root` and `chdir("/")` between fork and exec.
#[allow(unsafe_code)]
fn chroot_before_exec(cmd: &mut Command, root: &Path) -> Result<(), CommandError> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    let root_c = std::ffi::CString::new(root.as_os_str().as_bytes())
        .map_err(|_| CommandError::Failed("host root path contains a NUL byte".into()))?;
    // SAFETY: the closure runs in the forked child before exec. It only calls the
    // async-signal-safe syscalls chroot(2) and chdir(2) on C strings prepared before the
    // fork, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::chroot(root_c.as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::chdir(c"/".as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

/// Sends SIGKILL to the process group led by `pid` (the command and anything it forked).
#[allow(unsafe_code)]
fn kill_group(pid: u32) {
    let Ok(pid) = libc::pid_t::try_from(pid) else { return };
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is touched.
    // The group was created for this command by `process_group(0)`, so it holds only
    // the command and its descendants.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(command: &str, args: &[&[&str]]) -> ExecGrant {
        ExecGrant {
            command: command.into(),
            args: args.iter().map(|l| l.iter().map(|s| (*s).to_owned()).collect()).collect(),
            timeout_seconds: None,
            max_output_bytes: None,
        }
    }

    fn v(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn patterns_match_position_by_position() {
        let g = [grant("/usr/bin/kubeadm", &[&["upgrade", "apply", "v1.*"], &["certs", "renew", "**"]])];
        assert!(authorize(&g, "/usr/bin/kubeadm", &v(&["upgrade", "apply", "v1.34.1"])).is_ok());
        assert!(authorize(&g, "/usr/bin/kubeadm", &v(&["certs", "renew"])).is_ok());
        assert!(authorize(&g, "/usr/bin/kubeadm", &v(&["certs", "renew", "all", "--x"])).is_ok());
        for bad in [&["upgrade", "apply"][..], &["upgrade", "apply", "v2.0", "x"], &["reset", "-f"], &["certs"]] {
            match authorize(&g, "/usr/bin/kubeadm", &v(bad)) {
                Err(Refusal::NotGranted(m)) => assert!(m.contains("/usr/bin/kubeadm"), "{m}"),
                other => panic!("{bad:?} should be refused, got {other:?}"),
            }
        }
    }

    #[test]
    fn empty_arg_list_allows_only_no_arguments() {
        let g = [grant("/bin/true", &[])];
        assert!(authorize(&g, "/bin/true", &[]).is_ok());
        assert!(matches!(authorize(&g, "/bin/true", &v(&["x"])), Err(Refusal::NotGranted(_))));
    }

    #[test]
    fn commands_must_match_exactly_and_be_normal() {
        let g = [grant("/usr/bin/kubeadm", &[&["**"]])];
        assert!(matches!(authorize(&g, "/usr/bin/kubectl", &[]), Err(Refusal::NotGranted(_))));
        for bad in ["usr/bin/kubeadm", "/usr/bin/../bin/kubeadm", "/usr//bin/kubeadm", "/usr/./bin/kubeadm"] {
            assert!(matches!(authorize(&g, bad, &[]), Err(Refusal::Invalid(_))), "{bad}");
        }
    }

    #[test]
    fn grants_with_misplaced_double_star_are_invalid() {
        assert!(validate_grant(&grant("/bin/x", &[&["**", "a"]])).is_err());
        assert!(validate_grant(&grant("/bin/x", &[&["[a"]])).is_err());
        assert!(validate_grant(&grant("bin/x", &[])).is_err());
        assert!(validate_grant(&grant("/bin/x", &[&["a", "**"]])).is_ok());
    }
}
